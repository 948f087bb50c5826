"""Fair waiting, on every store: a request that waited is not starved by newcomers."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from django_esdlock import lock_tree
from django_esdlock.conf import load_backend
from django_esdlock.modes import Mode
from django_esdlock.records import Kind, LockRequest, Node, Owner

from .peer import setup_django
from .procs import spawned


@pytest.fixture
def lock_config(store_config):
    return store_config


def request(path: str, mode: Mode, holder_id: str, *, ticket: int | None = None) -> LockRequest:
    owner = dataclasses.replace(Owner.current(), process=holder_id)  # a distinct owner per request
    return LockRequest(holder_id, owner, ((Node("default", Kind.TREE, path), mode),), 30, ticket=ticket)


def test_a_marker_queues_newcomers_and_orders_waiters(backend):
    assert backend.acquire(request("/a", Mode.IS, "reader")) is not None
    assert backend.acquire(request("/a", Mode.X, "writer", ticket=100)) is None  # refused: leaves a marker
    # A newcomer compatible with the reader still queues behind the waiting writer...
    assert backend.acquire(request("/a", Mode.IS, "newcomer")) is None
    # ...and so does a waiter with a later ticket, but not one with an earlier ticket.
    assert backend.acquire(request("/a", Mode.IS, "later", ticket=200)) is None
    assert backend.acquire(request("/a", Mode.IS, "earlier", ticket=50)) is not None
    # Once the writer gives up, its marker goes and newcomers pass again.
    backend.withdraw(request("/a", Mode.X, "writer", ticket=100))
    assert backend.acquire(request("/a", Mode.IS, "newcomer")) is not None


def test_a_marker_expires_without_its_waiter(backend):
    backend.marker_ttl = 0.5
    assert backend.acquire(request("/a", Mode.IX, "holder")) is not None
    assert backend.acquire(request("/a", Mode.S, "dies-waiting", ticket=1)) is None
    assert backend.acquire(request("/a", Mode.IX, "newcomer")) is None
    time.sleep(0.7)
    assert backend.acquire(request("/a", Mode.IX, "newcomer")) is not None


def _streamer(config, until, seed) -> None:
    setup_django()
    backend = load_backend(config)
    rng = random.Random(seed)
    while time.time() < until:
        with lock_tree(f"/a/{rng.randrange(50)}", backend=backend, timeout=30):
            time.sleep(rng.uniform(0.02, 0.05))


def test_writer_is_not_starved_by_a_stream_below_it(lock_config, backend):
    until = time.time() + 15
    with spawned(_streamer, [(lock_config, until, seed) for seed in range(4)]) as streamers:
        time.sleep(3)  # the stream is flowing: /a always has intention holders below it
        streamers.check()
        started = time.monotonic()
        with lock_tree("/a", timeout=10, backend=backend):
            waited = time.monotonic() - started
            granted_at = time.time()
        streamers.results(timeout=60)
    # Granted while the stream still ran (not after it dried up), within a few holds.
    assert granted_at < until - 5, f"the writer only got in as the stream ended ({waited:.2f}s)"
    assert waited < 5
