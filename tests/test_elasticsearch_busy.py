"""A busy Elasticsearch (429 from a circuit breaker) is retried within deadlines: never a grant, never a lost lock.

The genuine node makes the 429s itself: a test lowers the dynamic in-flight
requests breaker through the cluster settings API, so every request with a
body is refused with ``circuit_breaking_exception`` until it is restored.
Settings updates and body-less requests still pass. noida-db has no
breakers, so these tests need the genuine node (CI runs them there).
"""

from __future__ import annotations

import contextlib
import io
import threading
import time

import elasticsearch
import pytest
from django.core.management import call_command
from django.test import override_settings

from django_esdlock import LockStoreBusy, lock_tree
from django_esdlock.conf import load_backend

from .admin_support import staff_user
from .contract import all_holders
from .stores import es_store

BREAKER = "network.breaker.inflight_requests.limit"


@pytest.fixture
def lock_config(es_url):
    with es_store(es_url, ttl=5) as config:
        yield config


@pytest.fixture
def backend(lock_config):
    backend = load_backend(lock_config)
    backend.setup()
    with busy(backend):
        try:
            backend.client.options(retry_on_status=()).search(index=backend.index, query={"match_all": {}})
        except elasticsearch.ApiError as e:
            assert e.meta.status == 429, e
        else:
            pytest.skip("needs a genuine Elasticsearch: this store (noida-db) has no circuit breaker to answer 429")
    yield backend
    backend.close()


@contextlib.contextmanager
def busy(backend, *, for_seconds: float | None = None):
    """Make the node refuse every request with a body (429); restore after ``for_seconds``, or on leaving."""
    client = backend.client.options(retry_on_status=())
    restored = threading.Event()

    def restore() -> None:
        if not restored.is_set():
            restored.set()
            client.cluster.put_settings(transient={BREAKER: None})

    client.cluster.put_settings(transient={BREAKER: "1b"})
    timer = threading.Timer(for_seconds, restore) if for_seconds is not None else None
    try:
        if timer is not None:
            timer.start()
        yield
    finally:
        if timer is not None:
            timer.cancel()
        restore()


def test_the_breaker_refuses_our_requests(backend):
    with busy(backend), pytest.raises(LockStoreBusy, match="circuit_breaking_exception"):
        lock_tree("/a/b", timeout=0, backend=backend).acquire()
    assert all_holders(backend) == []


def test_an_acquire_waits_out_a_busy_store_within_its_timeout(backend):
    with busy(backend, for_seconds=1.5):
        started = time.monotonic()
        with lock_tree("/a/b", timeout=20, backend=backend) as lock:
            assert time.monotonic() - started >= 1.0
            assert lock.token > 0
            assert {(h.node.key, h.mode.value) for h in all_holders(backend)} == {("/a", "IX"), ("/a/b", "X")}
    assert all_holders(backend) == []


def test_a_store_busy_past_the_timeout_is_store_busy_and_leaves_nothing(backend):
    with busy(backend):
        started = time.monotonic()
        with pytest.raises(LockStoreBusy):
            lock_tree("/a/b", timeout=1, backend=backend).acquire()
        assert time.monotonic() - started >= 1.0
    assert all_holders(backend) == []
    with lock_tree("/a/b", timeout=0, backend=backend):
        pass


def test_renewals_refused_for_less_than_the_lease_do_not_lose_the_lock(backend):
    # TTL 5 s: the renewer renews every 5/3 s, and retries every 0.5 s while the store refuses (for 2 s).
    with lock_tree("/a", backend=backend) as lock:
        with busy(backend, for_seconds=2):
            time.sleep(2.5)
        time.sleep(1.5)  # a renewal after the store came back
        assert not lock.lost
        lock.check()
    assert all_holders(backend) == []


def test_a_release_waits_out_a_busy_store(backend):
    lock = lock_tree("/a/b", backend=backend).acquire()
    with busy(backend, for_seconds=1.5):
        lock.release()  # raises LockLost if any holder had gone
    assert all_holders(backend) == []


def test_a_release_refused_past_its_retries_says_store_busy(backend):
    backend.busy_retry = 0.5
    lock = lock_tree("/a/b", backend=backend).acquire()
    with busy(backend), pytest.raises(LockStoreBusy):
        lock.release()
    assert {h.node.key for h in all_holders(backend)} == {"/a", "/a/b"}  # left to its lease, not half released


def test_listing_and_reaping_wait_out_a_busy_store(backend, lock_config):
    with lock_tree("/a/b", backend=backend), busy(backend, for_seconds=1.5):
        assert {h.node.key for h in all_holders(backend)} == {"/a", "/a/b"}
    raw = lock_tree("/gone", ttl=0.5, backend=backend).acquire()
    raw.abandon()  # stops renewing: expires in 0.5 s
    time.sleep(1)
    out = io.StringIO()
    with busy(backend, for_seconds=1.5), override_settings(LOCK_BACKEND=lock_config):
        call_command("reap_locks", stdout=out)
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
