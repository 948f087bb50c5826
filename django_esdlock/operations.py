"""What the admin's actions do to holders, each logged with its user: force release, recover now, reap now."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType

from .backends.base import BaseLockBackend
from .conf import get_backend
from .held_lock import HeldLock
from .reaper import Reaper, ReapReport, release_if_unchanged
from .records import HolderRecord, main_record
from .recovery import get_handler

logger = logging.getLogger("django_esdlock")

REAP_OBJECT = "reap"
"""The ``object_id`` of the admin log entries of reaping (a whole store, not one holder)."""


def background_tasks() -> str | None:
    """Return the class name of the task backend that runs tasks apart from the request, or None.

    Django's Tasks framework (``django.tasks`` from Django 6, the
    ``django-tasks`` backport before): ``TASKS["default"]``, unless it runs
    tasks in the caller (``ImmediateBackend``) or never (``DummyBackend``).
    """
    from django.conf import settings

    if "default" not in (getattr(settings, "TASKS", None) or {}):
        return None
    try:
        try:  # Django 6
            from django.tasks import task_backends
        except ImportError:
            from django_tasks import task_backends
        name = type(task_backends["default"]).__name__
    except Exception:  # noqa: BLE001 - no framework, or a backend that does not load: run inline
        return None
    return None if name in ("ImmediateBackend", "DummyBackend") else name


def holder_repr(record: HolderRecord) -> str:
    """How a holder is named in log entries and messages: node, mode and owner."""
    owner = record.owner
    who = f"{owner.get('host', '?')} pid {owner.get('pid', '?')} {owner.get('thread_name', '')}".strip()
    return f"{record.node} {record.mode.value} held by {who}"


def log(user_id: Any, object_id: str, object_repr: str, flag: int, message: str) -> None:
    """Write an admin log entry (the admin's history of held locks); without a user, the library's log only."""
    logger.info("%s: %s", object_repr, message)
    if user_id is None:
        return
    LogEntry.objects.create(
        user_id=user_id,
        content_type=ContentType.objects.get_for_model(HeldLock, for_concrete_model=False),
        object_id=object_id,
        object_repr=object_repr[:200],
        action_flag=flag,
        change_message=message,
    )


def force_release(
    backend: BaseLockBackend, records: Sequence[HolderRecord], user_id: Any, *, discard_intent: bool
) -> bool:
    """Release one holder if it is still the one listed; log it. Return whether it was released.

    A holder that carries an intent is released only with ``discard_intent``:
    its half-done change is then never recovered, and the log says so.
    """
    main = main_record(records)
    intent = next((r.intent for r in records if r.intent), None)
    if intent is not None and not discard_intent:
        raise ValueError(f"holder {main.holder_id} carries an intent: recover it, or discard the intent explicitly")
    if not release_if_unchanged(backend, records):
        return False
    message = f"Force-released holder {main.holder_id} on {len(records)} node(s)."
    if intent is None and backend.lock_delay:
        message += f" Its nodes stay refused for the lock delay ({backend.lock_delay:g} s): it may still write."
    if intent is not None:
        message += f" Discarded its intent {json.dumps(intent, sort_keys=True)} (never recovered)."
    log(user_id, main.holder_id, holder_repr(main), DELETION, message)
    return True


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one admin action did, for a message."""

    ok: bool
    message: str
    task_id: str | None = None


def recover_now(holder_id: str, seen_owner_key: str | None, user_id: Any, *, how: str) -> Outcome:
    """Recover a holder with an intent now: its handler runs under a take-over, then the holder is released.

    Only if the holder still has the owner the user saw (``seen_owner_key``)
    and, as it is read here, its lease (see :meth:`Reaper.recover`). Logged.
    """
    backend = get_backend()
    records = backend.holder_records(holder_id)
    if not records:
        return Outcome(False, f"Holder {holder_id} is gone: nothing to recover.")
    main = main_record(records)
    if seen_owner_key is not None and main.owner_key != seen_owner_key:
        return Outcome(False, f"Holder {holder_id} changed hands since it was shown ({holder_repr(main)}): left held.")
    report = Reaper(backend).recover(records)
    return _recovered(main, report, user_id, how)


def _recovered(main: HolderRecord, report: ReapReport, user_id: Any, how: str) -> Outcome:
    op = (main.intent or {}).get("op")
    if report.recovered or report.finished:
        entry = (report.recovered or report.finished)[0]
        message = f"Recovered holder {main.holder_id} ({how}): ran the handler of {op!r} under token {entry['token']}."
        if report.finished:
            message = f"Released holder {main.holder_id} ({how}): its intent {op!r} had been recovered already."
        log(user_id, main.holder_id, holder_repr(main), CHANGE, message)
        return Outcome(True, message)
    if report.failed:
        message = f"Recovery of holder {main.holder_id} ({how}) failed: {report.failed[0]['error']}"
        log(user_id, main.holder_id, holder_repr(main), CHANGE, message)
        return Outcome(False, message)
    if report.unrecoverable:
        return Outcome(False, f"No recovery handler is registered for op {op!r}: holder {main.holder_id} left held.")
    return Outcome(False, f"Holder {main.holder_id} changed since it was read (renewed or claimed): left held.")


def reap_now(user_id: Any, *, how: str) -> ReapReport:
    """Run one reaper pass over the store, as ``reap_locks`` does; log what it did."""
    report = Reaper(get_backend()).run()
    counts = report.as_dict()["counts"]
    message = (
        f"Reaped ({how}): removed {counts['evicted']} expired holder(s), recovered {counts['recovered']}, "
        f"released {counts['finished']} recovered earlier, {counts['failed']} failed, "
        f"{counts['unrecoverable']} without a handler."
    )
    log(user_id, REAP_OBJECT, "reap_locks", CHANGE, message)
    return report


def handler_of(records: Sequence[HolderRecord]) -> bool:
    """Whether the intent of a holder has a recovery handler registered here."""
    intent = next((r.intent for r in records if r.intent), None)
    return intent is not None and get_handler(intent.get("op")) is not None
