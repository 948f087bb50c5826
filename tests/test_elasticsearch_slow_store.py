"""A store that answers slowly gets waiting markers that outlast its answers: its polls renew them less often.

A poll renews its marker once half of its lease is gone. With the fixed
3 s lease, a store that took a second to answer saw a renewal (a write of
the node and every marker on it) in nearly every poll of a busy queue, which
slowed it further: on noida-db 100 async tasks on one tree wrote 22,753
ACQUIRE updates for 300 holds and took 363 s (116 s once the lease follows
the answers). The answers here are slowed by a loopback proxy.
"""

from __future__ import annotations

import time

import pytest

from django_esdlock.checker.proxy import Proxy
from django_esdlock.conf import load_backend
from django_esdlock.modes import Mode
from django_esdlock.records import Kind, LockRequest, Node

from . import waiting_state
from .stores import es_store

LATENCY = 0.6
"""Seconds the proxy holds each answer: a lease of eight of those outlasts the 3 s default."""

NODE = Node("fs", Kind.TREE, "/slow")


@pytest.fixture
def slow_and_straight(es_url):
    """A backend through a proxy that delays every answer, and one straight to the same fresh index."""
    host, port = es_url.removeprefix("http://").rsplit(":", 1)
    proxy = Proxy(host, int(port))
    with es_store(es_url) as config:
        straight = load_backend(config)
        straight.setup()
        slow = load_backend({**config, "OPTIONS": {**config["OPTIONS"], "hosts": [f"http://127.0.0.1:{proxy.port}"]}})
        slow.setup()  # its first use's checks, before the answers slow down
        proxy.latency = LATENCY
        yield slow, straight
        proxy.latency = 0.0
        slow.close()
        straight.close()
        proxy.close()


def _marker_lease(backend, request: LockRequest) -> float:
    """Poll once (refused); return how long the marker it leaves lasts from the moment the poll was sent."""
    sent = time.time()
    assert backend.acquire(request) is None
    (waiter,) = [w for w in backend.wait_state([NODE]).waiters if w.holder_id == request.holder_id]
    return waiter.expires_at.timestamp() - sent


def test_a_slow_store_gets_markers_that_outlast_its_answers(slow_and_straight):
    slow, straight = slow_and_straight
    waiting_state.hold(straight, "holder", NODE.key)
    fast = LockRequest("fast-waits", waiting_state.owner("fast"), ((NODE, Mode.X),), 60, ticket=1)
    assert _marker_lease(straight, fast) <= straight.marker_ttl + 0.5  # the default, from a store that answers
    waiter = LockRequest("slow-waits", waiting_state.owner("slow"), ((NODE, Mode.X),), 60, ticket=2)
    # The slow backend learns how long its store takes to answer from its acquires (here one of another node).
    other = LockRequest("other", waiting_state.owner("slow"), ((Node("fs", Kind.TREE, "/other"), Mode.X),), 60)
    slow.release(slow.acquire(other))
    lease = _marker_lease(slow, waiter)
    assert lease > 8 * LATENCY - 1.0 > slow.marker_ttl, lease
    # Its polls still come often enough to keep that longer marker alive.
    assert slow.queued_poll_interval(waiter) <= lease / 3
