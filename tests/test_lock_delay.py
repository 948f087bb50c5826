"""The lock delay (``LOCK_DELAY``): a node whose holder expired or was evicted stays refused; a release frees it.

The store judges by its clock. The deterministic tests move a holder's lease
back in the store (``tests/expiry.py``) to just inside or just past the delay,
so nothing is waited out. The process test freezes a real holder (SIGSTOP)
past its lease and thaws it: with a delay longer than the pause its late act
comes before the next grant; without one, after it (the control).
"""

from __future__ import annotations

import datetime
import os
import threading
import time
import uuid

import pytest

from django_esdlock import lock_tree
from django_esdlock.conf import load_backend
from django_esdlock.exceptions import InvalidLockBackend
from django_esdlock.modes import Mode
from django_esdlock.reaper import Reaper, release_if_unchanged
from django_esdlock.records import Kind, LockRequest, Node, Owner
from tests.contract import store_params
from tests.expiry import expire
from tests.peer import SPAWN, setup_django
from tests.procs import frozen, spawned

DELAY = 30.0
TTL = 60.0
ADMIN = "/admin/django_esdlock/heldlock/"
WAIT = 60.0
"""Seconds any step of the process test may take before it fails the test."""


@pytest.fixture
def delayed(store_config):
    """A backend of each store with a lock delay of ``DELAY`` seconds."""
    backend = load_backend({**store_config, "LOCK_DELAY": DELAY})
    yield backend
    backend.close()


def request_for(path: str, mode: Mode = Mode.X, owner: Owner | None = None) -> LockRequest:
    """A request for ``path`` alone in ``mode`` (no ancestors: the node itself is what the delay keeps)."""
    node = Node("default", Kind.TREE, path)
    return LockRequest(f"h-{uuid.uuid4().hex}", owner or Owner.current(), ((node, mode),), TTL)


def other_owner() -> Owner:
    return Owner(host="elsewhere", pid=4242, thread=1, thread_name="t", process=uuid.uuid4().hex)


def test_an_expired_holder_keeps_its_node_refused_until_the_delay_passes(delayed):
    holder = delayed.acquire(request_for("/d/a"))
    assert holder is not None
    expire(delayed, holder.request.holder_id, by=TTL + 5)  # ended 5 s ago: inside the delay
    assert delayed.acquire(request_for("/d/a", owner=other_owner())) is None
    assert delayed.acquire(request_for("/d/a", Mode.S, owner=other_owner())) is None
    assert delayed.acquire(request_for("/d/a", owner=holder.request.owner)) is None  # its own owner too
    assert delayed.acquire(request_for("/d/b", owner=other_owner())) is not None  # another node is not held back
    assert not delayed.renew(holder)  # an expired lease is never revived, delay or not
    expire(delayed, holder.request.holder_id, by=DELAY)  # ended 35 s ago: past the delay
    assert delayed.acquire(request_for("/d/a", owner=other_owner())) is not None
    held = delayed.node_holders(Node("default", Kind.TREE, "/d/a"))
    assert holder.request.holder_id not in {r.holder_id for r in held}


def test_without_a_delay_the_same_expired_holder_is_evicted_at_once(store_config):
    backend = load_backend(store_config)
    try:
        assert backend.lock_delay == 0
        holder = backend.acquire(request_for("/d/a"))
        expire(backend, holder.request.holder_id, by=TTL + 5)
        assert backend.acquire(request_for("/d/a", owner=other_owner())) is not None
    finally:
        backend.close()


def test_a_released_holder_frees_its_node_at_once(delayed):
    holder = delayed.acquire(request_for("/d/a"))
    assert delayed.release(holder)
    assert delayed.acquire(request_for("/d/a", owner=other_owner())) is not None


def test_a_holder_in_its_delay_is_kept_by_another_holders_release(delayed):
    """A release on a shared node drops expired holders there, but not one still in its delay."""
    node = Node("default", Kind.TREE, "/d")
    owner = other_owner()
    late = delayed.acquire(LockRequest(f"h-{uuid.uuid4().hex}", Owner.current(), ((node, Mode.IX),), TTL))
    live = delayed.acquire(LockRequest(f"h-{uuid.uuid4().hex}", owner, ((node, Mode.IX),), TTL))
    expire(delayed, late.request.holder_id, by=TTL + 5)
    assert delayed.release(live)
    assert delayed.acquire(LockRequest(f"h-{uuid.uuid4().hex}", owner, ((node, Mode.X),), TTL)) is None
    assert [r.holder_id for r in delayed.node_holders(node)] == [late.request.holder_id]


def test_the_reaper_leaves_a_holder_in_its_delay_and_evicts_it_after(delayed):
    holder = delayed.acquire(request_for("/d/a"))
    expire(delayed, holder.request.holder_id, by=TTL + 5)
    assert Reaper(delayed).run().evicted == []
    assert delayed.acquire(request_for("/d/a", owner=other_owner())) is None
    expire(delayed, holder.request.holder_id, by=DELAY)
    assert [r.holder_id for r in Reaper(delayed).run().evicted] == [holder.request.holder_id]


def test_a_forced_release_evicts_the_holder_for_the_delay(delayed):
    node = Node("default", Kind.TREE, "/d/a")
    holder = delayed.acquire(request_for("/d/a", owner=other_owner()))  # not this thread: the evictor's owner
    assert release_if_unchanged(delayed, delayed.holder_records(holder.request.holder_id))
    assert not delayed.renew(holder)  # the evicted holder learns it lost the lock
    assert delayed.acquire(request_for("/d/a", owner=other_owner())) is None
    (entry,) = delayed.node_holders(node)
    # Its lease ends at once (EVICTED_LEASE, 1 ms after the store's clock: maybe not yet by this read's end).
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=0.05)
    assert entry.holder_id == holder.request.holder_id and entry.expires_at <= soon
    expire(delayed, holder.request.holder_id, by=DELAY + 5)
    assert delayed.acquire(request_for("/d/a", owner=other_owner())) is not None


def test_a_forced_release_of_a_holder_with_an_intent_frees_at_once(delayed):
    """Kept, its intent would wait for a recovery the operator chose to skip: it is released instead."""
    node = Node("default", Kind.TREE, "/d/a")
    request = LockRequest(f"h-{uuid.uuid4().hex}", Owner.current(), ((node, Mode.X),), TTL, intent={"op": "x"})
    holder = delayed.acquire(request)
    assert release_if_unchanged(delayed, delayed.holder_records(holder.request.holder_id))
    assert delayed.acquire(request_for("/d/a", owner=other_owner())) is not None


@pytest.mark.parametrize(
    ("value", "message"),
    [(-1, "0 or more"), (float("inf"), "0 or more"), ("5", "0 or more"), (True, "0 or more")],
)
def test_a_bad_lock_delay_is_refused(value, message):
    with pytest.raises(InvalidLockBackend, match=message):
        load_backend({"BACKEND": "django_esdlock.backends.database.DatabaseLockBackend", "LOCK_DELAY": value})


def test_the_url_sets_the_lock_delay():
    from django_esdlock.conf import parse_url

    assert parse_url("sqlite:////tmp/x.sqlite3?lock_delay=2.5")["LOCK_DELAY"] == 2.5
    with pytest.raises(InvalidLockBackend, match="lock_delay"):
        parse_url("sqlite:////tmp/x.sqlite3?lock_delay=soon")


# --- a real holder, frozen past its lease -------------------------------------------------------

PATH = "/delayed/frozen"


def frozen_holder(lock_config: dict, ttl: float, ready, go, acts) -> None:
    """Take the lock, say ready, wait to be frozen and thawed; then act at once (an unfenced write) and go."""
    setup_django()
    lock = lock_tree(PATH, ttl=ttl, backend=load_backend(lock_config)).acquire()
    ready.put(os.getpid())
    if not go.wait(WAIT):
        raise TimeoutError("never thawed")
    acts.put(time.monotonic())  # what a late, unfenced write would do now
    lock.abandon()


def frozen_then_taken(lock_config: dict, *, ttl: float, pause: float) -> tuple[float, float]:
    """Freeze a holder for ``pause`` s (longer than its lease) while a newcomer waits; return (its act, the grant)."""
    ready, go, acts = SPAWN.Queue(), SPAWN.Event(), SPAWN.Queue()
    granted: list[float] = []
    errors: list[BaseException] = []
    backend = load_backend(lock_config)

    def newcomer() -> None:
        try:
            with lock_tree(PATH, timeout=WAIT, backend=backend):
                granted.append(time.monotonic())
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    try:
        with spawned(frozen_holder, [(lock_config, ttl, ready, go, acts)]) as workers:
            pid = workers.receive(ready, "the holder was not ready", WAIT)
            with frozen(pid, WAIT):
                taker = threading.Thread(target=newcomer, daemon=True)
                taker.start()
                time.sleep(pause)
            go.set()
            act = workers.receive(acts, "the thawed holder did not act", WAIT)
            workers.results(WAIT)
            taker.join(WAIT)
            assert not taker.is_alive(), "the newcomer was not granted"
    finally:
        backend.close()
    assert not errors, errors
    return act, granted[0]


@pytest.mark.parametrize("kind", store_params())
def test_a_frozen_holders_late_act_comes_before_the_next_grant(kind, shared_stores, django_db_blocker):
    """Frozen 1.5 s past a lease of 1 s (2 s on Elasticsearch), with a 5 s delay: the newcomer is granted after
    the holder's late act. Without a delay (the control) it was granted while the holder was still frozen."""
    ttl = 2.0 if kind == "elasticsearch" else 1.0
    pause = ttl + 1.5
    with django_db_blocker.unblock():
        config = shared_stores.get(kind)
        act, grant = frozen_then_taken({**config, "LOCK_DELAY": 5.0}, ttl=ttl, pause=pause)
        assert grant > act, f"granted {act - grant:.3f}s before the frozen holder's late act, despite the delay"
        act, grant = frozen_then_taken(config, ttl=ttl, pause=pause)
        assert grant < act, f"without a delay, granted only {grant - act:.3f}s after the late act"


@pytest.mark.django_db
def test_the_admin_shows_the_delay_and_its_forced_release_evicts(client, django_user_model, store_config, settings):
    from django.contrib.admin.models import LogEntry

    from django_esdlock.conf import get_backend

    from .admin_support import staff_user

    settings.LOCK_BACKEND = {**store_config, "LOCK_DELAY": DELAY}
    client.force_login(staff_user(django_user_model, "releaser", "view_heldlock", "delete_heldlock"))
    backend = get_backend()
    holder_id = backend.acquire(request_for("/d/a", owner=other_owner())).request.holder_id
    listing = client.get(ADMIN)
    assert b"lock delay" in listing.content and b"node refused until" not in listing.content
    response = client.post(ADMIN + "release/", {"holder": holder_id, "confirm": "yes"})
    assert response.status_code == 302
    (entry,) = LogEntry.objects.filter(object_id=holder_id)
    assert "refused for the lock delay (30 s)" in entry.change_message
    listing = client.get(ADMIN)
    (row,) = listing.context["rows"]
    assert row["record"].holder_id == holder_id and row["delayed_until"] is not None
    assert b"node refused until" in listing.content
    assert backend.acquire(request_for("/d/a", owner=other_owner())) is None
