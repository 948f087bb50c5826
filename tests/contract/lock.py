"""The behaviour every lock backend must show, written once, run against each store.

A backend's test module subclasses :class:`LockBackendContract` and provides a
``lock_config`` fixture: a ``LOCK_BACKEND`` dict pointing at an empty store.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time

import pytest

from django_esdlock import LockDeadlock, LockLost, LockTimeout, LockUnavailable, locks
from django_esdlock.modes import Mode, compatible
from django_esdlock.records import Kind, LockRequest, Node, Owner

from ..apis import SyncApi
from ..expiry import expire
from ..leases import wait_until


def all_holders(backend) -> list:
    """Every holder in the store, walking all pages."""
    found, cursor = [], None
    while True:
        page = backend.holders(cursor=cursor, limit=50)
        found.extend(page.holders)
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def held_keys(backend) -> set[tuple[str, str]]:
    return {(h.node.key, h.mode.value) for h in all_holders(backend)}


def raw_grant(backend, path: str, mode: Mode, *, ttl: float, namespace: str = "default"):
    """Take one node through the backend primitive alone: no renewer keeps it alive."""
    request = LockRequest(
        holder_id=f"raw-{time.monotonic_ns()}",
        owner=Owner.current(),
        targets=((Node(namespace, Kind.TREE, path), mode),),
        ttl=ttl,
    )
    grant = backend.acquire(request)
    assert grant is not None
    return grant


def markers_on(backend, path: str, namespace: str = "default") -> list:
    """The live waiting markers on tree node ``path``, as the store reports them."""
    node = Node(namespace, Kind.TREE, path)
    return [w for w in backend.wait_state([node]).waiters if w.node == node]


def requests_sent(backend) -> set[str]:
    """Record, from now on, the ids of the acquire requests the backend is asked to send (it still sends them).

    A set: a backend's async twin may run its blocking method, and both record the one request.
    """
    sent: set[str] = set()
    acquire, aacquire = backend.acquire, backend.aacquire

    def recorded(request):
        sent.add(request.holder_id)
        return acquire(request)

    async def arecorded(request):
        sent.add(request.holder_id)
        return await aacquire(request)

    backend.acquire, backend.aacquire = recorded, arecorded
    return sent


def refused_to_another_owner(path: str, backend) -> str:
    """What another owner of this process (a thread) gets asking for ``path`` now: "refused" if it is held."""
    outcome: list[str] = []

    def contender() -> None:
        try:
            lock = locks.lock_tree(path, timeout=0, backend=backend).acquire()
        except LockUnavailable:
            outcome.append("refused")
        except Exception as e:  # noqa: BLE001 - shown by the test's assertion
            outcome.append(repr(e))
        else:
            outcome.append("granted")
            lock.release()

    thread = threading.Thread(target=contender)
    thread.start()
    thread.join(30)
    return outcome[0] if outcome else "no answer"


class LockBackendContract:
    """Subclass with a ``lock_config`` fixture; every test here must pass unchanged.

    The ``backend`` and ``peer`` fixtures (tests/conftest.py) build on it.
    ``api`` is the lock API under test: the blocking one, or the async one
    driven from these blocking tests (tests/apis.py).
    """

    api: type = SyncApi

    # --- the compatibility matrix, across two processes --------------------

    @pytest.mark.parametrize(("held", "requested"), list(itertools.product(Mode, Mode)))
    def test_matrix_cell_across_processes(self, backend, peer, held, requested):
        assert peer.acquire("held", scheme="raw", path="/node", mode=held.value, timeout=0)["token"] > 0
        lock = self.api.Lock(((Node("default", Kind.TREE, "/node"), requested),), timeout=0, backend=backend)
        if compatible(held, requested):
            with lock:
                assert lock.token > 0
        else:
            with pytest.raises(LockUnavailable):
                lock.acquire()
        peer.release("held")
        with self.api.Lock(((Node("default", Kind.TREE, "/node"), requested),), timeout=0, backend=backend):
            pass

    # --- tree locks -----------------------------------------------------------

    def test_descendant_blocks_ancestor_and_back(self, backend, peer):
        peer.acquire("file", scheme="tree", path="/clinton/projects/elasticsearch/README.txt")
        with pytest.raises(LockUnavailable):
            self.api.lock_tree("/clinton", timeout=0, backend=backend).acquire()
        with pytest.raises(LockUnavailable):
            self.api.lock_tree("/clinton/projects/elasticsearch/README.txt/x", timeout=0, backend=backend).acquire()
        peer.release("file")
        with self.api.lock_tree("/clinton", timeout=0, backend=backend):
            assert (
                peer.acquire("file", scheme="tree", path="/clinton/projects/elasticsearch/README.txt", timeout=0)
                == "LockUnavailable"
            )

    def test_siblings_and_shared_readers_do_not_conflict(self, backend, peer):
        assert isinstance(peer.acquire("a", scheme="tree", path="/clinton/a"), dict)
        with self.api.lock_tree("/clinton/b", timeout=0, backend=backend):
            assert isinstance(peer.acquire("r", scheme="tree", path="/bill", shared=True, timeout=0), dict)
            with self.api.lock_tree("/bill/x", shared=True, timeout=0, backend=backend):
                with pytest.raises(LockUnavailable):  # the peer reads all of /bill
                    self.api.lock_tree("/bill/y", timeout=0, backend=backend).acquire()

    def test_shared_subtree_blocks_writer_below(self, backend, peer):
        peer.acquire("reader", scheme="tree", path="/clinton", shared=True)
        with pytest.raises(LockUnavailable):
            self.api.lock_tree("/clinton/projects/README.txt", timeout=0, backend=backend).acquire()
        with self.api.lock_tree("/clinton/projects/README.txt", shared=True, timeout=0, backend=backend):
            pass

    def test_namespaces_are_independent(self, backend, peer):
        peer.acquire("fs", scheme="tree", path="/clinton", namespace="fs")
        with self.api.lock_tree("/clinton", namespace="orders", timeout=0, backend=backend):
            pass

    # --- all or nothing ---------------------------------------------------------

    def test_partial_acquire_leaves_no_residue(self, backend, peer):
        peer.acquire("two", scheme="documents", ids=["2"])
        before = held_keys(backend)
        with pytest.raises(LockUnavailable):
            self.api.lock_documents(["1", "2", "3"], timeout=0, backend=backend).acquire()
        assert held_keys(backend) == before == {("2", "X")}

    def test_partial_tree_acquire_leaves_no_residue(self, backend, peer):
        peer.acquire("deep", scheme="tree", path="/a/b/c")
        before = {(h.node.key, h.mode.value, h.holder_id) for h in all_holders(backend)}
        with pytest.raises(LockTimeout):
            self.api.lock_tree("/a/b/c/d/e", timeout=0.2, backend=backend).acquire()
        assert {(h.node.key, h.mode.value, h.holder_id) for h in all_holders(backend)} == before
        peer.release("deep")
        assert all_holders(backend) == []

    # --- document locks -----------------------------------------------------------

    def test_document_locks_are_reentrant_and_release_only_their_own(self, backend, peer):
        with self.api.lock_documents(["1", "2"], backend=backend) as outer:
            with self.api.lock_documents(["2", "3"], timeout=0, backend=backend) as inner:
                assert inner.token >= outer.token
                assert {h.node.key for h in all_holders(backend)} == {"1", "2", "3"}
            assert {(h.node.key, h.holder_id) for h in all_holders(backend)} == {
                ("1", outer.holder_id),
                ("2", outer.holder_id),
            }
            assert peer.acquire("two", scheme="documents", ids=["2"], timeout=0) == "LockUnavailable"
            assert isinstance(peer.acquire("three", scheme="documents", ids=["3"], timeout=0), dict)
        assert {h.node.key for h in all_holders(backend)} == {"3"}

    def test_an_entry_of_this_owner_that_no_lock_holds_is_not_reentered(self, backend):
        """A release that never reached the store leaves this owner's entry: a document lock waits for its lease."""
        node = Node("default", Kind.DOCUMENT, "6")
        stale = LockRequest("stale-entry", Owner.current(), ((node, Mode.X),), 60, reentrant=True)
        assert backend.acquire(stale) is not None  # as a lock of this thread whose release failed left it
        with pytest.raises(LockUnavailable):
            self.api.lock_documents(["6"], timeout=0, backend=backend).acquire()
        expire(backend, "stale-entry")
        with self.api.lock_documents(["6"], timeout=0, backend=backend) as lock:
            assert [h.holder_id for h in all_holders(backend)] == [lock.holder_id]

    def test_a_document_lock_reenters_only_the_ids_its_thread_holds(self, backend):
        """Id 1 held by a lock of this thread, id 6 by a stale entry of this owner: a lock of both waits for 6."""
        stale = LockRequest("stale-entry", Owner.current(), ((Node("default", Kind.DOCUMENT, "6"), Mode.X),), 60)
        with self.api.lock_documents(["1"], timeout=0, backend=backend) as one:
            assert backend.acquire(stale) is not None  # as a lock of this thread whose release failed left it
            with pytest.raises(LockUnavailable):
                self.api.lock_documents(["1", "6"], timeout=0, backend=backend).acquire()
            expire(backend, "stale-entry")
            with self.api.lock_documents(["1", "6"], timeout=0, backend=backend) as both:
                holders = sorted((h.node.key, h.holder_id) for h in all_holders(backend))
                assert holders == [("1", one.holder_id), ("6", both.holder_id)]  # 1 reentered, 6 its own entry

    def test_release_removes_only_own_holder(self, backend, peer):
        peer.acquire("reader", scheme="tree", path="/shared/doc", shared=True)
        with self.api.lock_tree("/shared/doc", shared=True, timeout=0, backend=backend) as mine:
            assert len([h for h in all_holders(backend) if h.node.key == "/shared/doc"]) == 2
        left = [h for h in all_holders(backend) if h.node.key == "/shared/doc"]
        assert len(left) == 1 and left[0].holder_id != mine.holder_id
        with pytest.raises(LockUnavailable):  # the peer's reader is still there
            self.api.lock_tree("/shared/doc", timeout=0, backend=backend).acquire()

    def test_global_lock_excludes_other_processes(self, backend, peer):
        with self.api.global_lock(backend=backend, timeout=0):
            assert peer.acquire("g", scheme="global", timeout=0) == "LockUnavailable"
            assert isinstance(peer.acquire("other", scheme="global", name="nightly", timeout=0), dict)

    # --- waiting ------------------------------------------------------------------

    def test_timeout_zero_never_waits(self, backend, peer):
        peer.acquire("x", scheme="tree", path="/busy")
        with pytest.raises(LockUnavailable) as info:
            self.api.lock_tree("/busy", timeout=0, backend=backend).acquire()
        assert not isinstance(info.value, LockTimeout)
        assert markers_on(backend, "/busy") == []  # it never queued: a request that may wait leaves a marker

    def _granted_after_the_release(self, backend, peer, timeout: float | None) -> None:
        """A waiter queues (its marker is in the store), the holder leaves, then, and only then, it is granted."""
        peer.acquire("x", scheme="tree", path="/busy")
        events: list[str] = []

        def waiter() -> None:
            try:
                with self.api.lock_tree("/busy", timeout=timeout, backend=backend):
                    events.append("granted")
            except Exception as e:  # noqa: BLE001 - shown by the assertion on events
                events.append(repr(e))

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        wait_until(lambda: markers_on(backend, "/busy"), "the waiter's marker in the store")
        events.append("releasing")
        peer.release("x")
        thread.join(60)
        assert events == ["releasing", "granted"]

    def test_a_number_waits_for_a_release_then_gives_up(self, backend, peer):
        self._granted_after_the_release(backend, peer, 60)
        held = peer.acquire("y", scheme="tree", path="/busy")["holder_id"]
        with pytest.raises(LockTimeout, match=r"stayed unavailable for 0\.2s"):
            self.api.lock_tree("/busy", timeout=0.2, backend=backend).acquire()
        assert markers_on(backend, "/busy") == []  # it withdrew from the queue
        assert [h.holder_id for h in all_holders(backend)] == [held]  # the holder stayed

    def test_timeout_none_waits_for_release(self, backend, peer):
        self._granted_after_the_release(backend, peer, None)

    def test_waiting_on_own_lock_is_a_deadlock_at_once(self, backend):
        sent = requests_sent(backend)
        with self.api.lock_tree("/clinton", backend=backend):
            held = held_keys(backend)
            for other in (
                self.api.lock_tree("/clinton/projects", timeout=60, backend=backend),
                self.api.lock_tree("/clinton", shared=True, timeout=60, backend=backend),
            ):
                with pytest.raises(LockDeadlock):
                    other.acquire()
            assert len(sent) == 1  # ours alone: each deadlock was seen before a request reached the store
            assert held_keys(backend) == held and markers_on(backend, "/clinton") == []
        with self.api.global_lock(backend=backend), pytest.raises(LockDeadlock):
            self.api.global_lock(backend=backend, timeout=None).acquire()
        assert len(sent) == 2
        with self.api.lock_tree("/a/b", shared=True, backend=backend):
            with self.api.lock_tree("/a/c", shared=True, backend=backend):  # compatible: no deadlock
                pass
        assert len(sent) == 4

    # --- leases ---------------------------------------------------------------------

    def test_expired_holder_is_evicted_by_acquisition(self, backend):
        dead = raw_grant(backend, "/stale", Mode.X, ttl=30)
        with pytest.raises(LockUnavailable):
            self.api.lock_tree("/stale", timeout=0, backend=backend).acquire()
        expire(backend, dead.request.holder_id)
        with self.api.lock_tree("/stale", timeout=0, backend=backend) as lock:
            assert [h.holder_id for h in all_holders(backend)] == [lock.holder_id]
            assert lock.token > dead.token
        assert backend.release(dead) is False

    def test_fencing_tokens_strictly_increase_in_a_namespace(self, backend, peer):
        tokens = []
        for i in range(6):
            path = ["/f/a", "/f/b", "/f"][i % 3]
            if i % 2:
                result = peer.acquire("t", scheme="tree", path=path)
                tokens.append(result["token"])
                peer.release("t")
            else:
                with self.api.lock_tree(path, backend=backend) as lock:
                    tokens.append(lock.token)
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
        with (
            self.api.lock_tree("/f/a", backend=backend) as first,
            self.api.lock_documents(["x"], backend=backend) as second,
        ):
            assert second.token > first.token

    def test_renewal_keeps_a_hold_past_its_ttl(self, backend, peer):
        """Renewals move the store's expiry on; one that lands a TTL past the first was made after that lease ended."""
        node, ttl = Node("default", Kind.TREE, "/long"), datetime.timedelta(seconds=1)
        with self.api.lock_tree("/long", ttl=1, backend=backend) as lock:
            (first,) = backend.node_holders(node)
            seen = [first.expires_at]

            def renewed_past_the_first_lease() -> bool:
                (now,) = backend.node_holders(node)
                assert now.holder_id == lock.holder_id and now.expires_at >= seen[-1]
                if now.expires_at > seen[-1]:
                    seen.append(now.expires_at)
                return len(seen) >= 3 and seen[-1] >= first.expires_at + ttl

            wait_until(renewed_past_the_first_lease, "two renewals, the last past the first lease's end")
            assert peer.acquire("w", scheme="tree", path="/long", timeout=0) == "LockUnavailable"
            lock.check()
            assert not lock.lost
        assert isinstance(peer.acquire("w", scheme="tree", path="/long", timeout=0), dict)

    def test_lock_is_lost_when_its_record_is_removed(self, backend, peer):
        lost_reasons = []
        from django_esdlock.signals import lock_lost

        def on_lost(lock, reason, **kwargs):
            lost_reasons.append(reason)

        lock_lost.connect(on_lost)
        try:
            lock = self.api.lock_tree("/fragile", ttl=1, backend=backend).acquire()
            assert backend.release(lock.grant) is True  # an operator removes it behind our back
            assert isinstance(peer.acquire("thief", scheme="tree", path="/fragile", timeout=0), dict)
            wait_until(lambda: lock.lost, "the renewer noticing the record gone")
            wait_until(lambda: lost_reasons, "lock_lost sent")  # marked lost first, then the signal is sent
            with pytest.raises(LockLost):
                lock.check()
            with pytest.raises(LockLost):
                lock.release()
            assert len(lost_reasons) == 1  # sent once, by whoever noticed first
        finally:
            lock_lost.disconnect(on_lost)

    def test_decorator_acquires_on_each_call(self, backend, peer):
        @self.api.lock_tree("/decorated", timeout=0, backend=backend)
        def work():
            return peer.acquire("w", scheme="tree", path="/decorated", timeout=0)

        assert work() == "LockUnavailable"
        assert work() == "LockUnavailable"
        assert all_holders(backend) == []
