"""Semaphores across real processes on every store: never more than N holders, a frozen holder's slot, FIFO.

Holds are timed with ``time.monotonic_ns()`` (one clock for every process of
the machine) from inside each hold, after the grant and before the release:
an interval within the store's hold, so intervals that overlap held at once.
Every wait is bounded; a dead worker fails the test at once with its
traceback (``tests/procs.py``).
"""

from __future__ import annotations

import os
import time

import pytest

from django_esdlock import LockLost, semaphore
from django_esdlock.conf import load_backend
from django_esdlock.records import Kind, Node
from tests.contract import store_params
from tests.peer import SPAWN, setup_django
from tests.procs import frozen, spawned

WAIT = 60.0
"""Seconds any step of these tests may take before it fails the test."""

PROCESSES = 8
LIMIT = 3
ROUNDS = 6
HOLD = 0.04
"""Seconds each hold lasts: long enough that the limit is reached, never a judge of speed."""


@pytest.fixture(params=store_params())
def lock_config(request, shared_stores, django_db_blocker):
    with django_db_blocker.unblock():
        yield shared_stores.get(request.param)


def contender(config: dict, name: str, barrier) -> list[tuple[int, int, int]]:
    """Take a slot ``ROUNDS`` times; return (start, end, token) of each hold, timed from inside it."""
    setup_django()
    backend = load_backend(config)
    holds = []
    barrier.wait(WAIT)
    for _ in range(ROUNDS):
        with semaphore(name, LIMIT, timeout=WAIT, backend=backend) as lock:
            start = time.monotonic_ns()
            time.sleep(HOLD)
            lock.check()
            holds.append((start, time.monotonic_ns(), lock.token))
    backend.close()
    return holds


def most_at_once(holds: list[tuple[int, int, int]]) -> int:
    """The most intervals that overlap at one instant (an end before a start at the same instant)."""
    edges = sorted([(start, 1) for start, _, _ in holds] + [(end, -1) for _, end, _ in holds])
    at_once = most = 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    return most


def test_eight_processes_never_hold_a_semaphore_of_three_more_than_three_at_once(lock_config):
    barrier = SPAWN.Barrier(PROCESSES)
    with spawned(contender, [(lock_config, "jobs", barrier)] * PROCESSES) as workers:
        results = workers.results(WAIT * 3)
    holds = [hold for worker in results for hold in worker]
    assert len(holds) == PROCESSES * ROUNDS
    assert most_at_once(holds) == LIMIT  # never more, and reached
    tokens = [token for _, _, token in holds]
    assert len(set(tokens)) == len(tokens)  # one fencing token per grant


def frozen_holder(config: dict, name: str, ready, go) -> dict:
    """Take a slot with a short lease, say ready, wait to be frozen and thawed; then report what the lock says."""
    setup_django()
    lock = semaphore(name, 2, ttl=1.0, timeout=WAIT, backend=load_backend(config)).acquire()
    ready.put((os.getpid(), lock.token))
    if not go.wait(WAIT):
        raise TimeoutError("never thawed")
    outcome = {"lost": lock.lost}
    try:
        lock.check()
        outcome["check"] = "held"
    except LockLost:
        outcome["check"] = "LockLost"
    try:
        lock.release()
        outcome["release"] = "released"
    except LockLost:
        outcome["release"] = "LockLost"
    return outcome


def test_a_holder_frozen_past_its_lease_gives_its_slot_to_a_waiter_and_is_told_of_the_loss(lock_config):
    backend = load_backend(lock_config)
    ready, go = SPAWN.Queue(), SPAWN.Event()
    try:
        with spawned(frozen_holder, [(lock_config, "frozen", ready, go)]) as workers:
            pid, frozen_token = workers.receive(ready, "the holder was not ready", WAIT)
            other = semaphore("frozen", 2, timeout=WAIT, backend=backend).acquire()  # the second slot, renewed
            with frozen(pid, WAIT):
                # A third process's thread waits for a slot: granted once the store's clock ends the frozen lease.
                granted = []
                waiter = load_backend(lock_config)
                try:
                    with semaphore("frozen", 2, timeout=WAIT, backend=waiter) as lock:
                        granted.append(lock.token)
                        assert other.held
                finally:
                    waiter.close()
            go.set()
            (outcome,) = workers.results(WAIT)
            other.release()
    finally:
        backend.close()
    assert granted[0] > frozen_token
    assert outcome == {"lost": True, "check": "LockLost", "release": "LockLost"}


def queued_waiter(config: dict, name: str, ready, go) -> int:
    """Say ready, wait to be let go, then wait for the one slot; return when it was granted (``monotonic_ns``)."""
    setup_django()
    backend = load_backend(config)
    ready.put(os.getpid())
    if not go.wait(WAIT):
        raise TimeoutError("never let go")
    with semaphore(name, 1, timeout=WAIT, backend=backend):
        granted = time.monotonic_ns()
        time.sleep(0.01)
    backend.close()
    return granted


def test_queued_waiters_in_processes_are_granted_in_the_order_they_came(lock_config):
    backend = load_backend(lock_config)
    node = Node("default", Kind.SEMAPHORE, "fifo")
    ready, gos = SPAWN.Queue(), [SPAWN.Event() for _ in range(4)]
    try:
        holder = semaphore("fifo", 1, timeout=0, backend=backend).acquire()
        with spawned(queued_waiter, [(lock_config, "fifo", ready, go) for go in gos]) as workers:
            for _ in gos:
                workers.receive(ready, "a waiter was not ready", WAIT)
            for i, go in enumerate(gos):
                go.set()
                # The next one asks once this one's marker is in the store: the queue's order is known.
                deadline = time.monotonic() + WAIT
                while len(backend.wait_state([node]).waiters) < i + 1:
                    workers.check()
                    assert time.monotonic() < deadline, f"waiter {i} left no marker"
                    time.sleep(0.02)
            holder.release()
            granted = workers.results(WAIT)
    finally:
        backend.close()
    assert granted == sorted(granted)
