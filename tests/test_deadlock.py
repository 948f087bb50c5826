"""Deadlocks between processes, on every store: one victim per cycle, none without a cycle, nothing left held.

Real processes take nested locks in step (tests/deadlock_workers.py). Each
round, worker i holds resource i and may then ask for resource k: an edge
i -> k of a graph where no resource is asked for twice (no queue between
waiters), so its cycles are exactly the deadlocks the store must break.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import statistics
import threading

import pytest

from django_esdlock import alock_tree, lock_tree
from django_esdlock.backends.database import DatabaseLockBackend
from django_esdlock.exceptions import LockDeadlock, LockTimeout

from .dbstores import sqlite_store
from .deadlock_workers import nested_rounds
from .peer import SPAWN
from .procs import spawned

WORKERS = 4
DEADLOCK_TIMEOUT = 0.5
HOLD = 3 * DEADLOCK_TIMEOUT
"""How long a holder that waits for nothing holds: waiters behind it look for a cycle more than once."""

NAMESPACE = "deadlock"


@pytest.fixture
def lock_config(store_config):
    return {**store_config, "DEADLOCK_TIMEOUT": DEADLOCK_TIMEOUT}


def resource(style: str, i: int, *, inner: bool) -> dict:
    """Worker i's resource as an outer lock, or as asked for by another worker (``inner``).

    ``ancestor``: held ``/r<i>/w`` (IX on /r<i>), asked ``/r<i>``; ``descendant``:
    held ``/r<i>``, asked ``/r<i>/z``; ``docs``: the document ``d<i>``.
    """
    if style == "docs":
        return {"docs": [f"d{i}"], "namespace": NAMESPACE}
    held, asked = (f"/r{i}/w", f"/r{i}") if style == "ancestor" else (f"/r{i}", f"/r{i}/z")
    return {"tree": asked if inner else held, "namespace": NAMESPACE}


def round_plans(style: str, targets: list[int | None], active: set[int]) -> list[dict]:
    """One round's plan per worker: active workers hold their resource and ask for their target's."""
    plans = []
    for i, target in enumerate(targets):
        plans.append(
            {
                "outer": resource(style, i, inner=False) if i in active else None,
                "inner": None if target is None else resource(style, target, inner=True),
                "hold": HOLD,
            }
        )
    return plans


def graph_cycles(targets: list[int | None]) -> list[frozenset[int]]:
    """The cycles of the wait-for graph i -> targets[i]."""
    found = set()
    for start in range(len(targets)):
        path, i = [], start
        while i is not None and i not in path:
            path.append(i)
            i = targets[i]
        if i is not None and i == start:
            found.add(frozenset(path))
    return sorted(found, key=sorted)


def random_targets(rng: random.Random) -> list[int | None]:
    """Each worker asks for another's resource (most do) or holds; no resource is asked for twice."""
    free = list(range(WORKERS))
    targets: list[int | None] = []
    for i in range(WORKERS):
        choices = [k for k in free if k != i]
        if choices and rng.random() < 0.8:
            k = rng.choice(choices)
            free.remove(k)
            targets.append(k)
        else:
            targets.append(None)
    return targets


def scenario(seed: int, rounds: int) -> list[tuple[str, list[int | None], set[int]]]:
    """The fixed rounds, then ``rounds`` random ones: (style, targets, active workers)."""
    everyone = set(range(WORKERS))
    fixed = [
        ("ancestor", [1, 0, None, None], {0, 1}),  # two processes, through ancestors' intents
        ("docs", [1, 2, 0, None], {0, 1, 2}),  # three processes, document locks
        ("descendant", [None, 0, 1, 2], everyone),  # a chain of three waiters: no cycle
        ("descendant", [1, 0, 3, 2], everyone),  # two cycles at once
    ]
    rng = random.Random(seed)
    styles = ["ancestor", "descendant", "docs"]
    return fixed + [(rng.choice(styles), random_targets(rng), everyone) for _ in range(rounds)]


@pytest.mark.slow  # multi-process: ./runtests runs it on every store, tox leaves it out
def test_cycles_have_one_victim_each_chains_none_and_nothing_is_left_held(lock_config, backend):
    backend.setup()  # before the workers: N processes creating the tables or index on first use would race
    seed = random.SystemRandom().randrange(2**31)
    rounds = scenario(seed, rounds=6)
    per_worker = [[round_plans(*r)[i] for r in rounds] for i in range(WORKERS)]
    barrier = SPAWN.Barrier(WORKERS)
    with spawned(nested_rounds, [(lock_config, plans, barrier) for plans in per_worker]) as workers:
        outcomes = workers.results(timeout=60 + len(rounds) * 20)

    latencies = []
    for number, (style, targets, _) in enumerate(rounds):
        seen = [outcomes[i][number] for i in range(WORKERS)]
        where = f"round {number} ({style}, targets {targets}, seed {seed}): {[o['outcome'] for o in seen]}"
        cycles = graph_cycles(targets)
        victims = {i for i, o in enumerate(seen) if o["outcome"] == "victim"}
        in_cycles = set().union(*cycles) if cycles else set()
        assert victims <= in_cycles, f"a victim outside every cycle in {where}"
        for cycle in cycles:
            [victim] = victims & cycle or [None]
            assert victim is not None and len(victims & cycle) == 1, f"not one victim in cycle {set(cycle)}: {where}"
            assert seen[victim]["cycle"] == len(cycle), f"{seen[victim]['message']} ({where})"
            formed = max(seen[i]["started"] for i in cycle)
            latencies.append(seen[victim]["ended"] - formed)
            # The victim gave up first, then the one waiting for its resource got it: the victim broke the cycle.
            (behind,) = [i for i in cycle if targets[i] == victim]
            granted = seen[behind].get("granted", float("inf"))  # not granted at all: the outcome check below says so
            assert seen[victim]["ended"] <= granted, f"{behind} got in before the victim gave up: {where}"
        for i, o in enumerate(seen):
            if i not in victims:
                expected = (
                    "granted"
                    if targets[i] is not None
                    else "held"
                    if round_plans(*rounds[number])[i]["outer"]
                    else "idle"
                )
                assert o["outcome"] == expected, where
    assert latencies, f"no cycle in {len(rounds)} rounds (seed {seed})"
    print(
        f"deadlock latency over {len(latencies)} cycles (timeout {DEADLOCK_TIMEOUT}s): "
        f"p50 {statistics.median(latencies):.3f}s, max {max(latencies):.3f}s"
    )
    assert backend.holders().holders == []
    assert backend.wait_state().waiters == ()


def test_a_request_whose_owner_holds_nothing_never_looks(backend):
    looks = []
    backend.deadlock_timeout = 0.05
    backend.wait_state = lambda nodes=None: looks.append(nodes)  # never called, or the test fails
    with lock_tree("/a", namespace=NAMESPACE, backend=backend):
        waiter = threading.Thread(
            target=lambda: outcome.append(_try(lock_tree("/a", namespace=NAMESPACE, backend=backend, timeout=0.5)))
        )
        outcome: list = []
        waiter.start()
        waiter.join(30)
    assert outcome == [LockTimeout] and looks == []


def test_async_tasks_in_a_cycle_one_gives_up(backend):
    backend.deadlock_timeout = DEADLOCK_TIMEOUT

    async def task(mine: str, theirs: str, both_hold: asyncio.Barrier) -> str:
        async with alock_tree(mine, namespace=NAMESPACE, backend=backend):
            await asyncio.wait_for(both_hold.wait(), 30)
            try:
                async with alock_tree(theirs, namespace=NAMESPACE, backend=backend, timeout=30):
                    return "granted"
            except LockDeadlock as e:
                assert e.cycle is not None and len(e.cycle.requests) == 2
                return "victim"

    async def main() -> list[str]:
        both_hold = asyncio.Barrier(2)
        return await asyncio.gather(task("/a/x", "/b", both_hold), task("/b/y", "/a", both_hold))

    assert sorted(asyncio.run(main())) == ["granted", "victim"]
    assert backend.holders().holders == []


def test_a_store_that_cannot_list_waiters_is_never_asked_and_waiting_goes_on(django_db_blocker):
    class Blind(DatabaseLockBackend):
        looks = 0

        def wait_state(self, nodes=None):
            Blind.looks += 1
            return super(DatabaseLockBackend, self).wait_state(nodes)  # the base class: NotImplementedError

    with django_db_blocker.unblock(), sqlite_store() as config:
        backend = Blind(**config["OPTIONS"])
        backend.features = dataclasses.replace(backend.features, can_list_waiting=False)  # as it declares
        backend.deadlock_timeout = 0.1

        def holding_and_waiting() -> None:  # an owner that holds nothing would never look
            with lock_tree("/z", backend=backend):
                outcome.append(_try(lock_tree("/a/b", backend=backend, timeout=1)))

        with lock_tree("/a", backend=backend):
            waiting = threading.Thread(target=holding_and_waiting)
            outcome: list = []
            waiting.start()
            waiting.join(30)
        assert outcome == [LockTimeout] and Blind.looks == 0
        backend.close()


def _try(lock) -> type | None:
    try:
        lock.acquire()
    except Exception as e:  # noqa: BLE001 - the type is the answer
        return type(e)
    lock.release()
    return None
