"""A busy Elasticsearch (429 from a circuit breaker) is retried within deadlines: never a grant, never a lost lock.

The genuine node makes the 429s itself: a test lowers the dynamic in-flight
requests breaker through the cluster settings API, so every request with a
body is refused with ``circuit_breaking_exception`` until it is restored.
Settings updates and body-less requests still pass. noida-db has no
breakers, so these tests need the genuine node (CI runs them there): they skip
on noida-db alone, and on a genuine node a breaker that no longer trips fails.
Refusals are counted from the transport's log of every answer (status 429).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import time
import urllib.request

import elasticsearch
import pytest
from django.core.management import call_command
from django.test import override_settings

from django_esdlock import LockStoreBusy, lock_tree
from django_esdlock.conf import load_backend

from .admin_support import staff_user
from .contract import all_holders
from .leases import backdate, wait_until
from .stores import es_store

pytestmark = pytest.mark.alone  # the breaker trips for every client of the node, another test's too

BREAKER = "network.breaker.inflight_requests.limit"
PATIENCE = 60.0
"""Longest a test waits for the store to refuse, or for a request to get through once it is restored."""


class Refusals(logging.Handler):
    """Counts the node's 429 answers to this process, from the transport's log of every response it reads."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0
        self.ok_after_restore = 0
        self.restoring = False

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "[status:429 " in message:
            self.count += 1
        elif self.restoring and "[status:200 " in message and "_cluster/settings" not in message:
            self.ok_after_restore += 1


@pytest.fixture
def refusals():
    handler, transport = Refusals(), logging.getLogger("elastic_transport.transport")
    level = transport.level
    transport.addHandler(handler)
    transport.setLevel(logging.INFO)
    yield handler
    transport.removeHandler(handler)
    transport.setLevel(level)


def genuine(es_url: str) -> bool:
    """The store's identity: noida-db answers GET / with build_hash "noida" (and is what ESDLOCK_ES=noida runs)."""
    with urllib.request.urlopen(es_url, timeout=10) as answer:
        return json.load(answer)["version"].get("build_hash") != "noida"


@pytest.fixture
def lock_config(es_url):
    if os.environ.get("ESDLOCK_ES") == "noida" or not genuine(es_url):
        pytest.skip("noida-db has no circuit breaker to answer 429: these tests need the genuine node (CI's)")
    with es_store(es_url, ttl=5) as config:
        yield config


@pytest.fixture
def backend(lock_config, refusals):
    backend = load_backend(lock_config)
    backend.setup()
    with busy(backend):
        try:
            backend.client.options(retry_on_status=()).search(index=backend.index, query={"match_all": {}})
        except elasticsearch.ApiError as e:
            assert e.meta.status == 429, e
        else:
            pytest.fail(f"the genuine node answered while its {BREAKER} was 1b: the breaker no longer trips")
    refusals.count = 0
    yield backend
    backend.close()


@contextlib.contextmanager
def busy(backend, *, refusals: Refusals | None = None, restore_after: int = 0, events: list | None = None):
    """Make the node refuse every request with a body (429) until leaving or, with ``refusals``, until it
    has refused ``restore_after`` requests of this process (then a thread restores it, noting "restoring")."""
    client = backend.client.options(retry_on_status=())
    restored = threading.Event()

    def restore() -> None:
        if not restored.is_set():
            restored.set()
            if refusals is not None:
                refusals.restoring = True
            if events is not None:
                events.append("restoring")  # before the node lets anything through
            client.cluster.put_settings(transient={BREAKER: None})

    def restore_once_refused() -> None:
        deadline = time.monotonic() + PATIENCE
        while refusals.count < restore_after and time.monotonic() < deadline and not restored.is_set():
            time.sleep(0.02)
        restore()

    client.cluster.put_settings(transient={BREAKER: "1b"})
    watcher = threading.Thread(target=restore_once_refused) if refusals is not None else None
    try:
        if watcher is not None:
            watcher.start()
        yield
    finally:
        restore()
        if watcher is not None:
            watcher.join(PATIENCE)


def test_the_breaker_refuses_our_requests(backend):
    with busy(backend), pytest.raises(LockStoreBusy, match="circuit_breaking_exception"):
        lock_tree("/a/b", timeout=0, backend=backend).acquire()
    assert all_holders(backend) == []


def test_an_acquire_waits_out_a_busy_store_within_its_timeout(backend, refusals):
    events: list[str] = []
    with busy(backend, refusals=refusals, restore_after=2, events=events):
        with lock_tree("/a/b", timeout=PATIENCE, backend=backend) as lock:
            events.append("granted")
            assert lock.token > 0
            assert {(h.node.key, h.mode.value) for h in all_holders(backend)} == {("/a", "IX"), ("/a/b", "X")}
    # Refused (twice), then the store came back, then the grant: it waited the busy store out.
    assert refusals.count >= 2 and events == ["restoring", "granted"], (refusals.count, events)
    assert all_holders(backend) == []


def test_a_store_busy_past_the_timeout_is_store_busy_and_leaves_nothing(backend, refusals):
    # (That it tries again while the timeout lasts: the test above, granted only after refusals.)
    with busy(backend):
        with pytest.raises(LockStoreBusy):
            lock_tree("/a/b", timeout=1, backend=backend).acquire()
    assert refusals.count >= 1, "never refused: the store was not busy"
    assert all_holders(backend) == []
    with lock_tree("/a/b", timeout=0, backend=backend):
        pass


def test_renewals_refused_for_less_than_the_lease_do_not_lose_the_lock(backend, refusals):
    # TTL 5 s: the renewer renews every 5/3 s and retries every 0.5 s while the store refuses. Restored after
    # two refused renewals (well within the lease); then a renewal must get through.
    with lock_tree("/a", backend=backend) as lock:
        with busy(backend, refusals=refusals, restore_after=2):
            wait_until(lambda: refusals.restoring, what="two refused renewals", timeout=PATIENCE)
        wait_until(lambda: refusals.ok_after_restore, what="a renewal after the store came back", timeout=PATIENCE)
        assert refusals.count >= 2 and not lock.lost
        lock.check()
    assert all_holders(backend) == []


def test_a_release_waits_out_a_busy_store(backend, refusals):
    lock = lock_tree("/a/b", backend=backend).acquire()
    with busy(backend, refusals=refusals, restore_after=1):
        lock.release()  # raises LockLost if any holder had gone
    assert refusals.count >= 1, "the release was never refused: it proves nothing"
    assert all_holders(backend) == []


def test_a_release_refused_past_its_retries_says_store_busy(backend):
    backend.busy_retry = 0.5
    lock = lock_tree("/a/b", backend=backend).acquire()
    with busy(backend), pytest.raises(LockStoreBusy):
        lock.release()
    assert {h.node.key for h in all_holders(backend)} == {"/a", "/a/b"}  # left to its lease, not half released


def test_listing_and_reaping_wait_out_a_busy_store(backend, lock_config, refusals):
    with lock_tree("/a/b", backend=backend), busy(backend, refusals=refusals, restore_after=1):
        assert {h.node.key for h in all_holders(backend)} == {"/a", "/a/b"}
    assert refusals.count >= 1, "the listing was never refused"
    raw = lock_tree("/gone", backend=backend).acquire()
    gone = raw.holder_id
    raw.abandon()  # stops renewing
    backdate(lock_config, gone)  # and its lease ran out, by the store's clock
    refusals.count, out = 0, io.StringIO()
    with busy(backend, refusals=refusals, restore_after=1), override_settings(LOCK_BACKEND=lock_config):
        call_command("reap_locks", "--json", stdout=out)
    assert refusals.count >= 1, "the reaping was never refused"
    assert json.loads(out.getvalue())["counts"]["evicted"] >= 1, out.getvalue()
    assert all_holders(backend) == []


def test_the_admin_says_store_busy_instead_of_failing(backend, lock_config, client, django_user_model, settings):
    settings.LOCK_BACKEND = lock_config
    client.force_login(staff_user(django_user_model, "viewer", "view_heldlock"))
    backend.busy_retry = 0
    with busy(backend):
        # The admin's own backend instance: make it give up at once too.
        from django_esdlock.conf import get_backend

        get_backend().busy_retry = 0.3
        response = client.get("/admin/django_esdlock/heldlock/")
    assert response.status_code == 200
    assert "busy, retry in a moment" in response.context["error"]
