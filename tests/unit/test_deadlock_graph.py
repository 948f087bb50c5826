"""The wait-for graph (django_esdlock/deadlock.py), on hand-made states: no store."""

from __future__ import annotations

import datetime
import random
from collections import Counter

import pytest

from django_esdlock.bench import quadratic
from django_esdlock.bench.graph import crowd_state
from django_esdlock.deadlock import (
    Cycle,
    WaitEdge,
    WaitForGraph,
    confirmed,
    cycles,
    find_cycle,
    wait_edges,
    waiting_requests,
)
from django_esdlock.modes import Mode
from django_esdlock.records import HolderRecord, Kind, Node, WaiterRecord, WaitState

LATER = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)


def node(path: str) -> Node:
    return Node("fs", Kind.TREE, path)


def holds(owner: str, path: str, mode: Mode = Mode.X, holder_id: str | None = None) -> HolderRecord:
    return HolderRecord(node(path), mode, holder_id or f"h-{owner}-{path}", {"key": owner}, 1, None, LATER)


def waits(owner: str, path: str, mode: Mode = Mode.X, *, ticket: int, request: str | None = None) -> WaiterRecord:
    return WaiterRecord(node(path), mode, request or f"r-{owner}", {"key": owner, "host": "h", "pid": 1}, ticket, LATER)


def state(*records: HolderRecord | WaiterRecord) -> WaitState:
    return WaitState(
        tuple(r for r in records if isinstance(r, WaiterRecord)),
        tuple(r for r in records if isinstance(r, HolderRecord)),
    )


def test_two_owners_waiting_for_each_other_make_one_cycle_with_the_youngest_request_as_victim():
    s = state(holds("A", "/a"), holds("B", "/b"), waits("A", "/b", ticket=10), waits("B", "/a", ticket=20))
    from_a, from_b = find_cycle(s, "r-A"), find_cycle(s, "r-B")
    assert from_a is not None and from_b is not None
    assert from_a.victim.holder_id == from_b.victim.holder_id == "r-B"
    assert set(from_a.owners) == {"A", "B"} and set(from_a.nodes) == {node("/a"), node("/b")}
    assert "r-B"[:12] in from_a.describe()
    assert len(cycles(s)) == 1


def test_a_chain_without_a_way_back_is_no_cycle():
    # D holds /d and waits for nothing: C -> D, B -> C, A -> B is a chain.
    s = state(
        holds("D", "/d"),
        holds("C", "/c"),
        holds("B", "/b"),
        waits("C", "/d", ticket=3),
        waits("B", "/c", ticket=2),
        waits("A", "/b", ticket=1),
    )
    assert all(find_cycle(s, r) is None for r in ("r-A", "r-B", "r-C"))
    assert cycles(s) == []
    assert len(wait_edges(s)) == 3


def test_compatible_modes_make_no_edge_and_ancestor_intents_do():
    # B holds S on /t (reading the tree); A waits for IS below: compatible, no edge.
    s = state(holds("B", "/t", Mode.S), waits("A", "/t", Mode.IS, ticket=1))
    assert wait_edges(s) == []
    # A holds /t/x (IX on /t); B waits for X on /t: the ancestor's intent blocks it.
    s = state(holds("A", "/t", Mode.IX), waits("B", "/t", Mode.X, ticket=1))
    [edge] = wait_edges(s)
    assert (edge.waiter_owner, edge.blocker_owner, edge.blocker_mode) == ("B", "A", Mode.IX)


def test_a_waiter_queued_behind_an_earlier_marker_waits_for_its_owner_unless_it_holds_the_node():
    # A holds /a and waits for /q behind B's earlier request for X on /q; B waits for /a.
    s = state(
        holds("A", "/a"),
        holds("C", "/q", Mode.IS),
        waits("B", "/q", Mode.X, ticket=1),
        waits("A", "/q", Mode.IS, ticket=2),
        waits("B", "/a", Mode.X, ticket=1),
    )
    cycle = find_cycle(s, "r-A")
    assert cycle is not None and any(e.queued for e in cycle.edges)
    # B, only queued behind, is older than A: the victim is A, whose owner holds /a.
    assert cycle.victim.holder_id == "r-A" == find_cycle(s, "r-B").victim.holder_id
    # The same, but A holds /q already: the store lets it past the queue.
    s2 = state(*s.holders, holds("A", "/q", Mode.IS), *s.waiters)
    assert find_cycle(s2, "r-A") is None


def test_three_owners_in_a_ring_and_a_spectator():
    s = state(
        holds("A", "/a"),
        holds("B", "/b"),
        holds("C", "/c"),
        waits("A", "/b", ticket=30),
        waits("B", "/c", ticket=10),
        waits("C", "/a", ticket=20),
        waits("S", "/a", ticket=40),  # waits for the ring, is not in it
    )
    cycle = find_cycle(s, "r-B")
    assert cycle is not None and [r.owner_key for r in cycle.requests] == ["B", "C", "A"]
    assert cycle.victim.holder_id == "r-A"
    assert find_cycle(s, "r-S") is None


def test_a_cycle_is_confirmed_only_if_every_edge_still_stands_with_the_same_members():
    s = state(holds("A", "/a"), holds("B", "/b"), waits("A", "/b", ticket=10), waits("B", "/a", ticket=20))
    cycle = find_cycle(s, "r-B")
    assert cycle is not None and confirmed(cycle, s)
    released = state(holds("A", "/a"), waits("A", "/b", ticket=10), waits("B", "/a", ticket=20))
    assert not confirmed(cycle, released)
    # /b held again, by a new holder of B: a new acquisition, not the edge that was read.
    again = state(holds("A", "/a"), holds("B", "/b", holder_id="new"), *s.waiters)
    assert not confirmed(cycle, again)
    gave_up = state(*s.holders, waits("A", "/b", ticket=10))
    assert not confirmed(cycle, gave_up)


def test_own_holders_never_make_an_edge():
    s = state(holds("A", "/a", Mode.S), waits("A", "/a", Mode.X, ticket=1))
    assert wait_edges(s) == [] and find_cycle(s, "r-A") is None


# --- the same answers as the quadratic construction (django_esdlock/bench/quadratic.py) -------------

RANDOM_STATES = 2000


def random_state(rng: random.Random) -> WaitState:
    """A small state: a few owners holding and waiting on a few nodes, tickets that sometimes tie.

    Ids of holders and requests never coincide, and a request has one marker per node (as stores record them).
    """
    paths = [f"/{c}" for c in "abcd"[: rng.randint(1, 4)]]
    owners = [f"o{i}" for i in range(rng.randint(2, 7))]
    modes = list(Mode)

    def fields(owner: str) -> dict:
        # Now and then an owner the store did not record (an older release's marker): a stand-in key.
        return {} if owner == "o6" else {"key": owner, "host": "h", "pid": 1}

    holders = [
        HolderRecord(node(rng.choice(paths)), rng.choice(modes), f"h{i}", fields(rng.choice(owners)), 1, None, LATER)
        for i in range(rng.randint(0, 6))
    ]
    waiters = []
    for i in range(rng.randint(1, 8)):
        owner, ticket = rng.choice(owners), rng.randint(1, 12)
        for path in rng.sample(paths, rng.randint(1, len(paths))):
            waiters.append(WaiterRecord(node(path), rng.choice(modes), f"r{i}", fields(owner), ticket, LATER))
    rng.shuffle(waiters)
    return WaitState(tuple(waiters), tuple(holders))


def owners_waiting_for_each_other(edges: list[WaitEdge]) -> set[frozenset[str]]:
    """The groups of two or more owners each reachable from the other along ``edges`` (by closure: small graphs)."""
    reach: dict[str, set[str]] = {}
    for e in edges:
        reach.setdefault(e.waiter_owner, set()).add(e.blocker_owner)
        reach.setdefault(e.blocker_owner, set())
    changed = True
    while changed:
        changed = False
        for targets in reach.values():
            more = set().union(*(reach[t] for t in targets)) - targets
            if more:
                targets |= more
                changed = True
    groups = {frozenset({o} | {t for t in reach[o] if o in reach[t]}) for o in reach}
    return {g for g in groups if len(g) > 1}


def check_against_quadratic(s: WaitState) -> dict[str, int]:
    """Assert every answer of WaitForGraph on ``s`` is the quadratic construction's; return what ``s`` exercised."""
    graph = WaitForGraph(s)
    every = quadratic.wait_edges(s)
    keys = {e.key for e in every}
    # find_cycle: the very same cycle (requests, edges, order) from every request, hence the same victim.
    for holder_id in waiting_requests(s):
        assert graph.find_cycle(holder_id) == quadratic.find_cycle(s, holder_id), holder_id
    # deadlocks: the owners that wait for each other through every edge, two or more.
    assert set(graph.deadlocks) == owners_waiting_for_each_other(every)
    # cycles: the first cycle the quadratic listing has of each deadlock, in its order.
    old = quadratic.cycles(s)
    component = {o: i for i, owners in enumerate(graph.deadlocks) for o in owners}
    first: dict[int, Cycle] = {}
    for cycle in old:
        (at,) = {component[o] for o in cycle.owners}
        first.setdefault(at, cycle)
    assert graph.cycles() == list(first.values())
    assert {r.holder_id for c in old for r in c.requests} <= {
        h for h, r in waiting_requests(s).items() if r.owner_key in component
    }
    # edges: a subset of every edge; every holder edge; per marker and mode the nearest earlier marker.
    assert set(graph.edges) <= set(every)
    assert {e for e in every if not e.queued} == {e for e in graph.edges if not e.queued}
    ticket = {(w.holder_id, w.node): w.ticket for w in s.waiters}
    for waiter, node_, mode in {(e.waiter, e.node, e.blocker_mode) for e in every if e.queued}:
        behind = [e for e in every if e.queued and (e.waiter, e.node, e.blocker_mode) == (waiter, node_, mode)]
        (shown,) = [e for e in graph.edges if e.queued and (e.waiter, e.node, e.blocker_mode) == (waiter, node_, mode)]
        assert ticket[(shown.blocker, node_)] == max(ticket[(e.blocker, node_)] for e in behind)
    # stands (confirmed's test): exactly the keys of the relation, over every pair on a node.
    for w in s.waiters:
        for other in (*s.holders, *s.waiters):
            if other.node == w.node:
                candidate = WaitEdge(
                    w.holder_id, w.owner_key, w.node, w.mode, other.holder_id, other.owner_key, other.mode
                )
                assert graph.stands(candidate) == (candidate.key in keys)
    return {
        "cycles": len(old),
        "knotted": len(old) - len(graph.cycles()),
        "queued_in_cycle": sum(e.queued for c in old for e in c.edges),
        "edges_left_out": len(every) - len(graph.edges),
    }


def test_the_same_cycles_victims_and_confirmations_as_the_quadratic_construction_on_random_states():
    rng = random.Random(24)
    seen = Counter()
    for _ in range(RANDOM_STATES):
        s = random_state(rng)
        exercised = check_against_quadratic(s)
        seen.update({k: 1 for k, v in exercised.items() if v})
        # confirmed() on a later read that lost some records: the same verdict as before.
        later = WaitState(
            tuple(w for w in s.waiters if rng.random() > 0.1), tuple(h for h in s.holders if rng.random() > 0.1)
        )
        for cycle in quadratic.cycles(s):
            assert confirmed(cycle, later) == quadratic.confirmed(cycle, later)
            assert confirmed(cycle, s)
    # The states exercised what differs: cycles, several rings in one deadlock, queues inside cycles.
    assert min(seen[k] for k in ("cycles", "knotted", "queued_in_cycle", "edges_left_out")) > 20, seen


def test_a_waiter_behind_one_that_holds_the_node_still_waits_for_the_rest_of_the_queue():
    # C holds /q (IS) and waits for X there: it queues behind nobody. A's wait for B goes past C, not through it:
    # edges to the nearest earlier waiter only would lose the deadlock A -> B -> A.
    s = state(
        holds("C", "/q", Mode.IS),
        holds("A", "/z"),
        waits("B", "/q", ticket=1),
        waits("C", "/q", ticket=2),
        waits("A", "/q", ticket=3),
        waits("B", "/z", ticket=1),
    )
    cycle = find_cycle(s, "r-A")
    assert cycle is not None and set(cycle.owners) == {"A", "B"}
    assert cycle == quadratic.find_cycle(s, "r-A")
    assert confirmed(cycle, s)
    # Shown: A queued behind C (nearest), not behind B; the search still followed A -> B.
    assert [(e.blocker_owner, e.queued) for e in wait_edges(s) if e.waiter == "r-A"] == [("C", False), ("C", True)]


def crowd_behind_a_deadlock(size: int) -> WaitState:
    """``size`` requests queued for X on /q, held by A; A waits for /b, held by B; B's request on /q is the youngest.

    Every member of the crowd waits for A, who waits for B, who queues behind the crowd: one deadlock of them all.
    """
    records: list[HolderRecord | WaiterRecord] = [holds("A", "/q"), holds("B", "/b")]
    records += [waits(f"c{i:05d}", "/q", ticket=10 + i) for i in range(size)]
    records += [waits("A", "/b", ticket=5), waits("B", "/q", ticket=10 + size)]
    return state(*records)


def test_a_crowd_queued_behind_a_deadlock_is_one_component_and_the_youngest_request_is_the_victim():
    s = crowd_behind_a_deadlock(60)
    graph = WaitForGraph(s)
    assert [len(owners) for owners in graph.deadlocks] == [62]
    for holder_id in ("r-A", "r-B", "r-c00000", "r-c00059"):
        assert graph.find_cycle(holder_id) == quadratic.find_cycle(s, holder_id)
        assert graph.find_cycle(holder_id).victim.holder_id == "r-B"
    (cycle,) = graph.cycles()
    assert cycle.victim.holder_id == "r-B"
    # Queued edges on /q: 60·59/2 among the crowd and 60 of B's in the quadratic construction; one per waiter
    # here (but the first's). Holder edges as before: 61 to A, A's to B.
    assert len(quadratic.wait_edges(s)) == 60 * 59 // 2 + 60 + 62
    assert len(graph.edges) == 59 + 1 + 62


def test_a_ring_of_thousands_of_owners_is_found_without_recursion():
    size = 3000
    records: list[HolderRecord | WaiterRecord] = []
    for i in range(size):
        records += [holds(f"o{i}", f"/n{i}"), waits(f"o{i}", f"/n{(i + 1) % size}", ticket=i)]
    s = state(*records)
    cycle = find_cycle(s, "r-o0")
    assert cycle is not None and len(cycle.requests) == size and cycle.victim.holder_id == f"r-o{size - 1}"
    assert [c.victim.holder_id for c in cycles(s)] == [f"r-o{size - 1}"]


def test_the_same_cycles_through_a_crowd_of_mixed_modes_and_random_owner_keys():
    # The bench's state: the search walks the crowd in key order, through prefixes of the queues.
    s = crowd_state(80)
    graph = WaitForGraph(s)
    for holder_id in waiting_requests(s):
        assert graph.find_cycle(holder_id) == quadratic.find_cycle(s, holder_id), holder_id
    assert [c.victim.holder_id for c in graph.cycles()] == ["request-b"]
    assert set(graph.deadlocks) == owners_waiting_for_each_other(quadratic.wait_edges(s))


def test_the_collector_is_paused_while_reading_and_left_as_the_application_had_it():
    import gc

    from django_esdlock.deadlock import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the application's choice stands
    finally:
        gc.enable()
    with pytest.raises(ZeroDivisionError), collector_paused():
        1 / 0  # noqa: B018
    assert gc.isenabled()


def test_many_small_deadlocks_each_have_their_cycle_and_victim():
    records: list[HolderRecord | WaiterRecord] = []
    for i in range(100):
        a, b = f"a{i:03d}", f"b{i:03d}"
        records += [holds(a, f"/{a}"), holds(b, f"/{b}")]
        records += [waits(a, f"/{b}", ticket=2 * i), waits(b, f"/{a}", ticket=2 * i + 1)]
    s = state(*records)
    found = cycles(s)
    assert [c.victim.holder_id for c in found] == [f"r-b{i:03d}" for i in range(100)]
    assert found == quadratic.cycles(s)


# --- semaphores: held by all their holders, waited for until any one leaves ----------------------

SEM = Node("fs", Kind.SEMAPHORE, "jobs")


def sem_holds(owner: str) -> HolderRecord:
    return HolderRecord(SEM, Mode.S, f"h-{owner}-sem", {"key": owner}, 1, None, LATER)


def sem_waits(owner: str, *, ticket: int) -> WaiterRecord:
    return WaiterRecord(SEM, Mode.S, f"r-{owner}", {"key": owner, "host": "h", "pid": 1}, ticket, LATER)


def test_a_full_semaphore_whose_every_holder_waits_for_its_waiter_is_a_deadlock():
    # A holds /a and waits for the semaphore, full with B and C, who both wait for /a.
    s = state(
        holds("A", "/a"),
        sem_holds("B"),
        sem_holds("C"),
        sem_waits("A", ticket=10),
        waits("B", "/a", ticket=20, request="r-B"),
        waits("C", "/a", ticket=30, request="r-C"),
    )
    assert WaitForGraph(s).deadlocks == [frozenset({"A", "B", "C"})]
    cycle = find_cycle(s, "r-A")
    assert cycle is not None and SEM in cycle.nodes
    assert {(e.waiter, e.blocker) for e in wait_edges(s) if e.node == SEM} == {
        ("r-A", "h-B-sem"),
        ("r-A", "h-C-sem"),
    }
    assert confirmed(cycle, s)


def test_a_semaphore_with_one_holder_free_to_leave_is_no_deadlock():
    # As above, but C waits for nothing: when it leaves, A takes its slot, then B gets /a.
    s = state(
        holds("A", "/a"),
        sem_holds("B"),
        sem_holds("C"),
        sem_waits("A", ticket=10),
        waits("B", "/a", ticket=20, request="r-B"),
    )
    assert WaitForGraph(s).deadlocks == []
    assert find_cycle(s, "r-A") is None and find_cycle(s, "r-B") is None
    assert cycles(s) == []


def test_semaphore_waiters_queue_behind_each_other_whatever_their_modes():
    s = state(sem_holds("H"), sem_waits("A", ticket=10), sem_waits("B", ticket=20))
    queued = [(e.waiter, e.blocker) for e in wait_edges(s) if e.queued]
    assert queued == [("r-B", "r-A")]
