"""A holder process for the observability tests: it holds a lock, is frozen past its lease, and reports its counts."""

from __future__ import annotations

import os
import threading
from typing import Any

from .peer import setup_django

WAIT = 60.0
TTL = 2.0
"""Short, so the test's own acquire, which waits for the frozen lease to end in the store, is quick."""


def frozen_holder(lock_config: dict, path: str, namespace: str, ready: Any, go: Any) -> dict:
    """Hold ``path``; once thawed (``go``), wait to be told of the loss, release, and return the counts."""
    setup_django()
    from prometheus_client import REGISTRY

    from django_esdlock import LockLost, lock_tree, signals
    from django_esdlock.conf import load_backend
    from django_esdlock.observability import store_of

    backend = load_backend({**lock_config, "TTL": TTL})
    store = store_of(backend)
    told = threading.Event()
    signals.lock_lost.connect(lambda **kwargs: told.set(), weak=False)
    lock = lock_tree(path, namespace=namespace, backend=backend).acquire()
    ready.put(os.getpid())  # the test stops this process now, and lets it go once another took the lock
    if not go.wait(WAIT):
        raise TimeoutError("never let go")
    if not told.wait(WAIT):  # the renewer, running again, sees the lease ended
        raise TimeoutError("the loss was never told")
    try:
        lock.release()
        released = "released"
    except LockLost:
        released = "LockLost"
    backend.close()

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    tree = {"store": store, "namespace": namespace, "kind": "tree"}
    return {
        "release": released,
        "counts": {
            "store": store,
            "lost": {
                reason: sample("esdlock_lost_total", store=store, namespace=namespace, reason=reason)
                for reason in ("lease_expired", "record_gone")
            },
            "held_seconds": {
                outcome: sample("esdlock_held_seconds_count", **tree, outcome=outcome)
                for outcome in ("lost", "released")
            },
            "held": sample("esdlock_held", store=store, namespace=namespace),
            "granted": sample("esdlock_acquire_seconds_count", **tree, outcome="granted"),
        },
    }
