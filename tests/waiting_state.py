"""Real waiting state left in a store through the backend primitive, for the waiting page and reap_locks tests."""

from __future__ import annotations

import dataclasses
import time

from django_esdlock.backends.base import BaseLockBackend
from django_esdlock.backends.database import DatabaseLockBackend
from django_esdlock.modes import Mode
from django_esdlock.records import Kind, LockRequest, Node, Owner


def owner(name: str) -> Owner:
    """A distinct owner named ``name`` (its thread name), in this process."""
    return dataclasses.replace(Owner.current(), process=f"process-of-{name}", thread_name=name)


def hold(backend, name: str, path: str, mode: Mode = Mode.X, *, namespace: str = "fs") -> str:
    request = LockRequest(f"{name}-holds", owner(name), ((Node(namespace, Kind.TREE, path), mode),), 60)
    assert backend.acquire(request) is not None
    return request.holder_id


def wait(
    backend, name: str, path: str, mode: Mode = Mode.X, *, ticket: int, namespace: str = "fs", holds: bool = False
) -> str:
    """Send a request that is refused and leaves its waiting marker (the request itself does not try again).

    ``holds``: the owner holds other locks, as the API tells the store (``LockRequest.holds_others``).
    """
    node = Node(namespace, Kind.TREE, path)
    request = LockRequest(f"{name}-waits", owner(name), ((node, mode),), 60, ticket=ticket, holds_others=holds)
    assert backend.acquire(request) is None
    return request.holder_id


def leave_a_deadlock(backend) -> str:
    """Alice holds fs:/a and waits for fs:/b, bob holds fs:/b and waits for fs:/a; return the victim's request id.

    The markers last a minute (``backend.marker_ttl``): nobody renews them.
    """
    backend.marker_ttl = 60
    now = time.time_ns()
    hold(backend, "alice", "/a")
    hold(backend, "bob", "/b")
    wait(backend, "alice", "/b", ticket=now - 1_000_000_000, holds=True)
    return wait(backend, "bob", "/a", ticket=now, holds=True)  # the younger request: the victim


class NoWaitStateBackend(DatabaseLockBackend):
    """A backend that declares it cannot list waiting requests, and keeps the base class's answer if asked."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.features = dataclasses.replace(self.features, can_list_waiting=False)

    def wait_state(self, nodes=None):
        return BaseLockBackend.wait_state(self, nodes)


def wait_for_waiters(backend, count: int, *, what: str, key: str | None = None, timeout: float = 30.0) -> list:
    """Poll the store until ``count`` distinct requests wait (on node ``key`` if given); return their markers.

    Observed in the store's own waiting markers: "they are waiting by now"
    without a sleep that guesses it.
    """
    deadline = time.monotonic() + timeout
    while True:
        markers = [w for w in backend.wait_state().waiters if key is None or w.node.key == key]
        if len({w.holder_id for w in markers}) >= count:
            return markers
        assert time.monotonic() < deadline, f"{what}: {len(markers)} marker(s) after {timeout:g}s, wanted {count}"
        time.sleep(0.02)
