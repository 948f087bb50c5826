"""A worker process for the deadlock tests: rounds of nested locks, in step with the other workers.

Each round: every worker takes its outer lock (or none), all meet, then each
takes its inner lock (or holds a while), records what happened, and lets go.
"""

from __future__ import annotations

import time
from typing import Any

from .peer import setup_django

ROUND_WAIT = 60.0
"""Longest a worker waits for the others at a meeting point, or for an inner lock."""


def build(backend: Any, spec: dict[str, Any], **kwargs: Any) -> Any:
    """A lock on the worker's backend from a plain spec: ``{"tree": path}`` or ``{"docs": [ids]}``."""
    from django_esdlock import lock_documents, lock_tree

    if "tree" in spec:
        return lock_tree(spec["tree"], namespace=spec["namespace"], backend=backend, **kwargs)
    return lock_documents(spec["docs"], namespace=spec["namespace"], backend=backend, **kwargs)


def nested_rounds(config: dict[str, Any], plans: list[dict[str, Any]], barrier: Any) -> list[dict[str, Any]]:
    """Play ``plans`` (one per round: ``outer``, ``inner`` specs or None, ``hold`` seconds); return each outcome.

    An outcome is ``granted`` (the inner lock was taken), ``victim`` (it
    raised LockDeadlock: its cycle's size is kept), ``held`` (no inner lock:
    held the outer one for ``hold`` seconds) or ``idle``; with the wall-clock
    times (one host: one clock) the inner request started, was granted and
    ended, for the order of events and the printed latency.
    """
    setup_django()
    from django_esdlock.conf import load_backend
    from django_esdlock.exceptions import LockDeadlock

    backend = load_backend(config)
    outcomes = []
    try:
        for plan in plans:
            barrier.wait(ROUND_WAIT)
            outer = build(backend, plan["outer"], timeout=ROUND_WAIT).acquire() if plan["outer"] else None
            barrier.wait(ROUND_WAIT)
            outcome: dict[str, Any] = {"started": time.time()}
            if plan["inner"] is not None:
                try:
                    with build(backend, plan["inner"], timeout=ROUND_WAIT):
                        outcome.update(outcome="granted", granted=time.time())
                except LockDeadlock as e:
                    outcome.update(outcome="victim", cycle=len(e.cycle.requests), message=str(e))
            elif outer is not None:
                time.sleep(plan["hold"])
                outcome["outcome"] = "held"
            else:
                outcome["outcome"] = "idle"
            outcome["ended"] = time.time()
            if outer is not None:
                outer.release()
            outcomes.append(outcome)
        barrier.wait(ROUND_WAIT)
    finally:
        backend.close()
    return outcomes
