"""The log lines that name a lock: one line each, with ``extra`` fields a JSON formatter can index.

Every line carries ``namespace``, ``targets``, ``token``, ``holder_id``,
``owner`` and ``waited`` (None where it does not apply), on the
``django_esdlock`` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from .. import signals
from ..modes import Mode, is_grant
from ..records import HolderRecord

logger = logging.getLogger("django_esdlock")

MAX_TARGETS = 10
"""Targets named in a log line or span; the rest are counted (``+N more``)."""

MAX_TARGET_CHARS = 200


_GRANTS = frozenset(mode for mode in Mode if is_grant(mode))
"""The modes of the nodes a lock names (S, X), as a set: ``target_names`` runs at each acquire."""


def target_names(lock: Any) -> list[str]:
    """The paths, ids or names ``lock`` was asked for (its S/X nodes, not the ancestors), truncated."""
    keys = [node.key for node, mode in lock.targets if mode in _GRANTS] or [lock.targets[-1][0].key]
    return truncated(keys)


def truncated(keys: Sequence[str]) -> list[str]:
    names = [key if len(key) <= MAX_TARGET_CHARS else key[: MAX_TARGET_CHARS - 1] + "…" for key in keys[:MAX_TARGETS]]
    if len(keys) > MAX_TARGETS:
        names.append(f"+{len(keys) - MAX_TARGETS} more")
    return names


def lock_fields(lock: Any, *, waited: float | None = None) -> dict[str, Any]:
    """The ``extra`` of a line about ``lock``, one of this process's locks."""
    grant = lock.grant
    return {
        "namespace": lock.targets[-1][0].namespace,
        "targets": target_names(lock),
        "token": lock.token,
        "holder_id": grant.request.holder_id if grant else None,
        "owner": grant.request.owner.key if grant else None,
        "waited": None if waited is None else round(waited, 6),
    }


def record_fields(holder: HolderRecord, records: Sequence[HolderRecord] | None = None) -> dict[str, Any]:
    """The ``extra`` of a line about a holder as the store recorded it (the reaper's, the admin's)."""
    records = list(records) if records else [holder]
    return {
        "namespace": holder.node.namespace,
        "targets": truncated([r.node.key for r in records if is_grant(r.mode)] or [holder.node.key]),
        "token": holder.token,
        "holder_id": holder.holder_id,
        "owner": holder.owner_key,
        "waited": None,
    }


def slow_grant(lock: Any, waited: float, threshold: float) -> None:
    logger.warning(
        "granted %r after waiting %.3fs (over ESDLOCK_SLOW_WAIT, %gs)",
        lock,
        waited,
        threshold,
        extra=lock_fields(lock, waited=waited),
    )


def lost(lock: Any, reason: str) -> None:
    logger.warning("lost %r: %s", lock, reason, extra=lock_fields(lock))


def deadlock_victim(lock: Any, described: str, cycle: str, waited: float | None) -> None:
    logger.warning("deadlock: %s gives up: %s", described, cycle, extra=lock_fields(lock, waited=waited))


def _force_released(
    sender: Any, holder: HolderRecord, records: Sequence[HolderRecord], user: Any, **kwargs: Any
) -> None:
    logger.warning(
        "force-released holder %s of %s by %s",
        holder.holder_id,
        holder.node,
        getattr(user, "get_username", lambda: user)(),
        extra=record_fields(holder, records),
    )


def _recovered(sender: Any, holder: HolderRecord, lock: Any, **kwargs: Any) -> None:
    op = (holder.intent or {}).get("op")
    logger.info(
        "recovered holder %s of %s (%s) under token %s",
        holder.holder_id,
        holder.node,
        op,
        lock.token,
        extra=record_fields(holder),
    )


signals.lock_force_released.connect(_force_released, weak=False, dispatch_uid="django_esdlock.observability.logs")
signals.lock_recovered.connect(_recovered, weak=False, dispatch_uid="django_esdlock.observability.logs")
