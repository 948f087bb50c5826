"""The locks of the ``fs`` namespace held around a path, as the page's lock panel shows them."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from django_esdlock import get_backend
from django_esdlock.backends.base import BaseLockBackend
from django_esdlock.modes import Mode
from django_esdlock.paths import ancestors
from django_esdlock.records import HolderRecord, Kind, Node

from .documents import ROOT, is_within
from .renames import NAMESPACE


@dataclasses.dataclass(frozen=True)
class HeldLock:
    """One holder's main node (its S or X), with what the chapter would call its lock type."""

    path: str
    mode: str
    lock_type: str
    owner: str
    token: int | None
    expires_in: float
    intent: Mapping[str, Any] | None
    checkpoint: Mapping[str, Any] | None
    covers_view: bool
    """True for a lock on a directory above the one in view: it covers everything shown."""

    @property
    def expired(self) -> bool:
        return self.expires_in <= 0

    @property
    def awaiting_recovery(self) -> bool:
        return self.expired and bool(self.intent)


def _describe_owner(owner: Mapping[str, Any]) -> str:
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}"


def _main_records(records: Iterable[HolderRecord]) -> list[HolderRecord]:
    """Keep each holder's S or X record: its IS/IX records only say "something below is locked"."""
    return [r for r in records if r.mode in (Mode.S, Mode.X)]


def _as_held(record: HolderRecord, *, covers_view: bool) -> HeldLock:
    now = datetime.datetime.now(datetime.UTC)
    return HeldLock(
        path=record.node.key,
        mode=record.mode.value,
        lock_type="exclusive" if record.mode is Mode.X else "shared",
        owner=_describe_owner(record.owner),
        token=record.token,
        expires_in=(record.expires_at - now).total_seconds(),
        intent=record.intent,
        checkpoint=record.checkpoint,
        covers_view=covers_view,
    )


def locks_around(
    path: str, *, namespace: str = NAMESPACE, backend: BaseLockBackend | None = None, limit: int = 200
) -> list[HeldLock]:
    """Return the locks on ``path`` and below it, then those on directories above it, by path."""
    backend = backend or get_backend()
    prefix = None if path == ROOT else path
    page = backend.holders(namespace=namespace, path_prefix=prefix, limit=limit)
    below = [
        _as_held(r, covers_view=False)
        for r in _main_records(page.holders)
        if r.node.kind is Kind.TREE and is_within(r.node.key, path)
    ]
    above = []
    if path != ROOT:
        for ancestor in ancestors(path):
            records = backend.node_holders(Node(namespace, Kind.TREE, ancestor))
            above += [_as_held(r, covers_view=True) for r in _main_records(records)]
    return above + sorted(below, key=lambda held: held.path)


def blockers(paths: Iterable[str], *, namespace: str = NAMESPACE, backend: BaseLockBackend | None = None) -> str:
    """Return a sentence naming who holds locks on, under or above ``paths``, for a conflict message."""
    seen: dict[tuple[str, str], HeldLock] = {}
    for path in paths:
        for held in locks_around(path, namespace=namespace, backend=backend, limit=20):
            seen.setdefault((held.path, held.owner), held)
    if not seen:
        return "the lock was released meanwhile"
    parts = [f"{held.lock_type} lock on {held.path} held by {held.owner}" for held in list(seen.values())[:3]]
    more = f" and {len(seen) - 3} more" if len(seen) > 3 else ""
    return "; ".join(parts) + more
