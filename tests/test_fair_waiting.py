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

from .leases import wait_until
from .peer import SPAWN, setup_django
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
    # Nobody renews the marker: by the store's clock it runs out and the newcomer passes (a refusal leaves
    # no marker of its own: it has no ticket). Polled: Elasticsearch's scripts read a clock that lags.
    wait_until(lambda: backend.acquire(request("/a", Mode.IX, "newcomer")), what="the dead waiter's marker expiring")
    assert backend.wait_state().waiters == ()


STREAMERS = 4


def _streamer(config, seed, grants, stop) -> None:
    """Lock random children of /a, one after another, until ``stop``; count each grant in ``grants``."""
    setup_django()
    backend = load_backend(config)
    rng = random.Random(seed)
    while not stop.is_set():
        with lock_tree(f"/a/{rng.randrange(50)}", backend=backend, timeout=60):
            with grants.get_lock():
                grants.value += 1
            time.sleep(rng.uniform(0.02, 0.05))  # a hold: the stream's shape, not a synchronisation
    backend.close()


def test_writer_is_not_starved_by_a_stream_below_it(lock_config, backend):
    grants, stop = SPAWN.Value("q", 0), SPAWN.Event()
    with spawned(_streamer, [(lock_config, seed, grants, stop) for seed in range(STREAMERS)]) as streamers:
        try:
            # The stream is flowing: /a always has intention holders below it.
            wait_until(lambda: streamers.check() or grants.value >= 5 * STREAMERS, what="the stream", timeout=60)
            asked = grants.value
            with lock_tree("/a", timeout=60, backend=backend):
                overtaken = grants.value - asked
            released = grants.value
            # Readers got in after the writer: the stream still flowed, the writer did not wait for it to dry up.
            wait_until(lambda: streamers.check() or grants.value > released, what="a reader after the writer")
        finally:
            stop.set()
        streamers.results(timeout=60)
    # Newcomers queued behind the writer's marker: only requests already under way got in before it.
    assert overtaken <= 2 * STREAMERS, f"{overtaken} reader grants overtook the waiting writer"
