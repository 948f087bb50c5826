"""The semaphore contract: at most N holders, in order, fenced, leased, on every store.

Orders of events, never durations: a waiter's place is read from its marker
in the store, a lease is made to run out by moving it back (tests/expiry.py).
"""

from __future__ import annotations

import json
import logging
import queue
import threading

import pytest

from django_esdlock import InvalidLockArgument, LockDeadlock, LockLost, LockUnavailable
from django_esdlock.records import Kind, Node

from .. import handlers  # noqa: F401  (registers the test recovery handlers)
from ..apis import SyncApi
from ..expiry import expire
from ..leases import wait_until
from ..peer import Peer
from .lock import all_holders, requests_sent
from .reaper import reap

NAME = "reindex"
NODE = Node("default", Kind.SEMAPHORE, NAME)
WAIT = 30.0
"""Seconds any wait of these tests may take before it fails the test."""


def waiting_ids(backend) -> list[str]:
    """The request ids waiting on the semaphore, in their queue order."""
    return [w.holder_id for w in sorted(backend.wait_state([NODE]).waiters, key=lambda w: w.ticket)]


class Waiter:
    """A thread of this process (an owner of its own) that waits for a slot, holds it until told, and says so."""

    def __init__(self, api, backend, name: str, events: queue.Queue, *, limit: int) -> None:
        self.lock = api.semaphore(NAME, limit, timeout=WAIT, backend=backend)
        self.name = name
        self.events = events
        self.let_go = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with self.lock:
                self.events.put(("granted", self.name, self.lock.token))
                self.let_go.wait(WAIT)
        except Exception as e:  # noqa: BLE001 - the test reads it from the queue
            self.events.put(("failed", self.name, repr(e)))

    def finish(self) -> None:
        self.let_go.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), f"{self.name} did not finish"


def next_event(events: queue.Queue) -> tuple:
    event = events.get(timeout=WAIT)
    assert event[0] == "granted", event
    return event


class SemaphoreContract:
    """Subclass with a ``lock_config`` fixture (tests/contract/conftest.py has the matrix's)."""

    api: type = SyncApi

    def test_at_most_limit_holders_each_with_a_larger_token(self, backend, peer):
        held = [self.api.semaphore(NAME, 3, timeout=0, backend=backend).acquire() for _ in range(2)]
        assert peer.acquire("third", scheme="semaphore", name=NAME, limit=3, timeout=0)["token"] > held[-1].token
        with pytest.raises(LockUnavailable):
            self.api.semaphore(NAME, 3, timeout=0, backend=backend).acquire()
        assert peer.acquire("fourth", scheme="semaphore", name=NAME, limit=3, timeout=0) == "LockUnavailable"
        assert [held[0].token < held[1].token] == [True]
        assert sorted(h.mode.value for h in all_holders(backend)) == ["S", "S", "S"]
        held[0].release()
        fourth = peer.acquire("fourth", scheme="semaphore", name=NAME, limit=3, timeout=0)
        assert fourth["token"] > held[1].token
        assert held[1].limit == 3
        held[1].release()
        peer.release("third")
        peer.release("fourth")
        assert all_holders(backend) == []

    def test_waiting_for_a_slot_only_this_thread_holds_is_a_deadlock_at_once(self, backend):
        held = [self.api.semaphore(NAME, 2, backend=backend).acquire() for _ in range(2)]
        with pytest.raises(LockDeadlock, match="holds 2 of the 2 slots"):
            self.api.semaphore(NAME, 2, backend=backend).acquire()
        for lock in held:
            lock.release()

    def test_two_owners_each_waiting_for_a_slot_the_other_holds_are_a_deadlock_one_gives_up(self, backend):
        events: queue.Queue = queue.Queue()
        both_hold = threading.Barrier(2)

        def owner(name: str) -> None:
            try:
                with self.api.semaphore(NAME, 2, timeout=WAIT, backend=backend):
                    both_hold.wait(WAIT)
                    try:
                        with self.api.semaphore(NAME, 2, timeout=WAIT, backend=backend):
                            events.put(("granted", name))
                    except LockDeadlock as e:
                        events.put(("deadlock", name, e.cycle is not None))
            except Exception as e:  # noqa: BLE001 - the test reads it from the queue
                events.put(("failed", name, repr(e)))

        threads = [threading.Thread(target=owner, args=(name,), daemon=True) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        outcomes = sorted(events.get(timeout=WAIT) for _ in threads)
        for thread in threads:
            thread.join(WAIT)
        # The victim of the cycle gives up (and its outer slot with it): the other gets the slot it waited for.
        assert [o[0] for o in outcomes] == ["deadlock", "granted"], outcomes
        assert outcomes[0][2] is True  # a cycle between the two owners, not a wait for itself

    @pytest.mark.parametrize("limit", [0, -1, 1.5, True, "3", None])
    def test_a_bad_limit_is_refused_before_anything_is_sent(self, backend, limit):
        sent = requests_sent(backend)
        with pytest.raises(InvalidLockArgument, match="limit"):
            self.api.semaphore(NAME, limit, backend=backend)
        assert sent == set()

    @pytest.mark.parametrize(("name", "namespace"), [("", "default"), ("a\x00b", "default"), ("ok", "bad space")])
    def test_a_bad_name_is_refused_before_anything_is_sent(self, backend, name, namespace):
        sent = requests_sent(backend)
        with pytest.raises(InvalidLockArgument):
            self.api.semaphore(name, 2, namespace=namespace, backend=backend)
        assert sent == set()

    def test_the_first_holders_limit_stands_while_any_holds_and_a_mismatch_is_reported(self, backend, peer, caplog):
        first = self.api.semaphore(NAME, 2, timeout=0, backend=backend).acquire()
        with caplog.at_level(logging.WARNING, logger="django_esdlock"):
            second = self.api.semaphore(NAME, 5, timeout=0, backend=backend).acquire()
        assert (first.limit, second.limit) == (2, 2)
        assert any("asked with limit 5, granted under limit 2" in r.getMessage() for r in caplog.records)
        # Two hold a semaphore that stands at 2: a third is refused whatever it asks.
        assert peer.acquire("third", scheme="semaphore", name=NAME, limit=5, timeout=0) == "LockUnavailable"
        first.release()
        second.release()
        # Nobody holds: the next holder's limit stands.
        fresh = self.api.semaphore(NAME, 1, timeout=0, backend=backend).acquire()
        assert fresh.limit == 1
        assert peer.acquire("third", scheme="semaphore", name=NAME, limit=5, timeout=0) == "LockUnavailable"
        fresh.release()

    def test_waiters_are_granted_in_the_order_they_came_and_no_newcomer_passes_them(self, backend, peer):
        held = [self.api.semaphore(NAME, 2, timeout=0, backend=backend).acquire() for _ in range(2)]
        events: queue.Queue = queue.Queue()
        waiters = []
        for name in ("first", "second", "third"):
            before = len(waiting_ids(backend))
            waiters.append(Waiter(self.api, backend, name, events, limit=2))
            # Its marker is in the store before the next one comes: the queue's order is known.
            wait_until(lambda n=before: len(waiting_ids(backend)) > n, f"{name}'s waiting marker")
        assert events.empty()
        held[0].release()
        assert next_event(events)[1] == "first"
        # A slot is free only for the second waiter now: a newcomer that will not wait is refused.
        assert peer.acquire("newcomer", scheme="semaphore", name=NAME, limit=2, timeout=0) == "LockUnavailable"
        held[1].release()
        assert next_event(events)[1] == "second"
        waiters[0].finish()
        assert next_event(events)[1] == "third"
        for waiter in waiters[1:]:
            waiter.finish()
        assert events.empty(), list(events.queue)
        assert waiting_ids(backend) == []

    def test_an_expired_holder_gives_its_slot_to_a_waiter_and_is_told_of_the_loss(self, backend):
        holder = self.api.semaphore(NAME, 1, timeout=0, ttl=30, backend=backend).acquire()
        events: queue.Queue = queue.Queue()
        waiter = Waiter(self.api, backend, "waiter", events, limit=1)
        wait_until(lambda: waiting_ids(backend), "the waiter's marker")
        expire(backend, holder.holder_id)
        granted = next_event(events)
        assert granted[2] > holder.token
        with pytest.raises(LockLost):
            holder.release()
        waiter.finish()

    def test_timeout_zero_never_waits_and_leaves_no_marker(self, backend, peer):
        assert peer.acquire("only", scheme="semaphore", name=NAME, limit=1, timeout=0)["token"] > 0
        with pytest.raises(LockUnavailable, match=r"sem:reindex .* has every slot taken"):
            self.api.semaphore(NAME, 1, timeout=0, backend=backend).acquire()
        assert waiting_ids(backend) == []
        peer.release("only")
        with self.api.semaphore(NAME, 1, timeout=0, backend=backend) as lock:
            assert lock.token > 0

    def test_reap_locks_removes_a_killed_holder_and_recovers_one_with_an_intent(
        self, lock_config, backend, peer, tmp_path
    ):
        live = peer.acquire("live", scheme="semaphore", name=NAME, limit=3, ttl=30)
        out = tmp_path / "runs.jsonl"
        dead, recovering = Peer(lock_config), Peer(lock_config)
        try:
            gone = dead.acquire("gone", scheme="semaphore", name=NAME, limit=3, ttl=30)
            intent = {"op": "test-append", "file": str(out)}
            unfinished = recovering.acquire("job", scheme="semaphore", name=NAME, limit=3, ttl=30, intent=intent)
        finally:
            dead.kill()
            recovering.kill()
        expire(backend, unfinished["holder_id"])
        # Expired with an intent, it keeps its slot until it is recovered: the three slots stay taken.
        with pytest.raises(LockUnavailable):
            self.api.semaphore(NAME, 3, timeout=0, backend=backend).acquire()
        expire(backend, gone["holder_id"])
        report = reap(lock_config)
        assert [h["holder_id"] for h in report["evicted"]] == [gone["holder_id"]]
        assert report["evicted"][0]["holder_limit"] == 3
        assert [r["holder"]["holder_id"] for r in report["recovered"]] == [unfinished["holder_id"]]
        (run,) = [json.loads(line) for line in out.read_text().splitlines()]
        assert run["token"] > unfinished["token"]
        assert {h.holder_id for h in all_holders(backend)} == {live["holder_id"]}
        assert not peer.is_lost("live")
        peer.release("live")

    def test_a_semaphore_is_apart_from_a_lock_of_the_same_name(self, backend):
        with self.api.semaphore(NAME, 1, timeout=0, backend=backend):
            with self.api.global_lock(NAME, timeout=0, backend=backend):
                with self.api.lock_documents([NAME], timeout=0, backend=backend):
                    pass
