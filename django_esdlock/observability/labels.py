"""The label values of the metrics (and attributes of the spans): few, and never a path, an id or a token."""

from __future__ import annotations

from typing import Any

from ..exceptions import LockDeadlock, LockTimeout, LockUnavailable
from ..records import Kind

KIND_LABELS = {Kind.TREE: "tree", Kind.DOCUMENT: "documents", Kind.GLOBAL: "global", Kind.SEMAPHORE: "semaphore"}

OPERATIONS = {
    "acquire": "acquire",
    "release": "release",
    "read released lock nodes": "release",
    "renew": "renew",
    "withdraw waiting markers": "withdraw",
    "find waiting requests": "poll",
    "read waiting requests": "poll",
    "read the waiting requests": "poll",
    "read the store's clock": "poll",
    "refresh the lock index": "poll",
    "listen for releases": "poll",
    "list holders": "list",
    "search holders": "list",
    "read a lock node": "list",
    "look a holder up": "list",
    "find expired holders": "list",
    "evict expired holders": "reap",
    "delete emptied lock nodes": "reap",
    "drop expired waiting markers": "reap",
    "drop idle lock nodes": "reap",
    "take a holder over": "take_over",
}
"""The ``operation`` label of each store call the backends name (their ``action``); any other is ``setup``."""


def store_of(backend: Any) -> str:
    """The ``store`` label of a backend: ``elasticsearch``, ``postgresql``, ``sqlite`` (or its ``store_name``)."""
    name = getattr(backend, "store_name", None) or getattr(getattr(backend, "dialect", None), "vendor", None)
    if name:
        return name
    if ".elasticsearch" in type(backend).__module__:
        return "elasticsearch"
    return type(backend).__name__


def lock_labels(lock: Any) -> tuple[str, str, str]:
    """``store``, ``namespace`` and ``kind`` of a lock (its backend may fail to load: ``unknown``)."""
    node = lock.targets[-1][0]
    try:
        store = store_of(lock.backend)
    except Exception:  # noqa: BLE001 - the acquire reports the bad setting itself
        store = "unknown"
    return store, node.namespace, KIND_LABELS.get(node.kind, str(node.kind))


def outcome_of(error: BaseException | None) -> str:
    """The ``outcome`` label of an acquire that ended with ``error`` (None: granted)."""
    if error is None:
        return "granted"
    if isinstance(error, LockTimeout):
        return "timeout"
    if isinstance(error, LockUnavailable):
        return "unavailable"
    if isinstance(error, LockDeadlock):
        return "deadlock"
    return "error"


def loss_reason(reason: str) -> str:
    """The ``reason`` label of a loss: its words are for people, the label has a few values."""
    if "gone" in reason:
        return "record_gone"  # evicted, force-released or taken over in the store
    if "renewal" in reason or "ran out" in reason:
        return "lease_expired"  # no renewal succeeded within the lease (a frozen holder, a store out of reach)
    return "other"


def mode_of(lock: Any) -> str:
    return str(lock.targets[-1][1])
