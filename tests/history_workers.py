"""Workers of real processes that record lock_check's history of what they do, for tests that judge it with the
checker: spawned by tests/procs.py, their functions importable by name."""

from __future__ import annotations

import os
import time

from django_esdlock.conf import load_backend

from .peer import setup_django


def take_and_hold(config: dict, namespace: str, history_path: str) -> dict:
    """Ask for /file of ``namespace``, never waiting (``timeout=0``), every 50 ms until granted: new requests
    arriving one after another, as in a busy app (a queued waiter would sleep until the lease's end as its stamp
    tells); hold it 2 s, writing every 20 ms; release it. Return its token and how many requests it took."""
    setup_django()
    from django_esdlock import lock_tree
    from django_esdlock.checker.history import HistoryWriter
    from django_esdlock.checker.workload import node_list
    from django_esdlock.exceptions import LockBackendUnavailable, LockLost, LockUnavailable

    backend = load_backend(config)
    process = f"taker-{os.getpid()}"
    history = HistoryWriter(history_path, process)
    deadline = time.monotonic() + 60
    attempt = 0
    while time.monotonic() < deadline:
        op = f"{process}-{attempt}"  # unique across processes: the checker groups events by op
        attempt += 1
        lock = lock_tree("/file", namespace=namespace, timeout=0, backend=backend)
        history.record("invoke", op=op, kind="tree", api="lock_tree", nodes=node_list(lock.targets), timeout=0)
        try:
            lock.acquire()
        except LockUnavailable as e:
            history.record("fail", op=op, outcome="unavailable", error=str(e))
            time.sleep(0.05)
            continue
        except LockBackendUnavailable as e:  # the failover under way
            history.record("fail", op=op, outcome="store_unavailable", error=str(e))
            time.sleep(0.05)
            continue
        history.record("ok", op=op, holder=lock.holder_id, token=lock.token)
        until = time.monotonic() + 2
        while time.monotonic() < until:
            history.record("write", op=op, token=lock.token, valid=not lock.lost)
            time.sleep(0.02)
        history.record("release", op=op, valid=not lock.lost)
        outcome = "ok"
        try:
            lock.release()
        except LockLost:
            outcome = "lost"
            history.record("lost", op=op, how="LockLost at release")
        history.record("released", op=op, outcome=outcome)
        backend.close()
        return {"token": lock.token, "attempts": attempt}
    raise AssertionError(f"no grant in {attempt} attempts")
