"""The wait-for graph (django_esdlock/deadlock.py), on hand-made states: no store."""

from __future__ import annotations

import datetime

from django_esdlock.deadlock import confirmed, cycles, find_cycle, wait_edges
from django_esdlock.modes import Mode
from django_esdlock.records import HolderRecord, Kind, Node, WaiterRecord, WaitState

LATER = datetime.datetime(2100, 1, 1, tzinfo=datetime.timezone.utc)


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
