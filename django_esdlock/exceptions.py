"""Exceptions raised by django-esdlock."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .redaction import redact


class LockError(Exception):
    """Base class of every django-esdlock error; do not raise directly.

    Its message is redacted (``django_esdlock.redaction.redact``): no
    password, key or token of the settings reaches a traceback, a log or a page.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(arg) if isinstance(arg, str) else arg for arg in args))


class LockUnavailable(LockError):
    """The lock is held in a conflicting mode and the caller would not wait."""


class LockTimeout(LockUnavailable):
    """The lock stayed unavailable for the whole timeout."""


class LockLost(LockError):
    """The lease ran out or the holder record vanished: the lock is no longer held."""


class StaleFence(LockLost):
    """The data's store refused a write: what it guards carries a newer fencing token than the writer's.

    A newer holder of the lock wrote there, so the writer's lock was lost
    (paused past its lease, partitioned); nothing of the refused write was
    kept. ``token`` is the writer's token, ``newer`` the newest token found.
    """

    def __init__(self, message: str, *, token: int | None = None, newer: int | None = None) -> None:
        super().__init__(message)
        self.token = token
        self.newer = newer


class LockDeadlock(LockError):
    """Waiting would never end: the caller waits for itself, or for owners that wait for it.

    ``cycle`` is the ``django_esdlock.deadlock.Cycle`` of owners whose
    youngest request this was (None when the caller would wait for itself).
    The request took nothing; the caller should release what it holds.
    """

    def __init__(self, message: str, *, cycle: Any = None) -> None:
        super().__init__(message)
        self.cycle = cycle


class InvalidLockArgument(LockError, ValueError):
    """A path, id, namespace, timeout or TTL is malformed; nothing was sent."""


class InvalidLockPath(InvalidLockArgument):
    """A lock path, document id or lock name is malformed; nothing was sent."""


class LockBackendUnavailable(LockError):
    """The lock store could not be reached or answered with an error."""


class LockStoreBusy(LockBackendUnavailable):
    """The store turned the request away for now (overloaded: HTTP 429 or 503); nothing was granted.

    Waiting requests retry it within their timeout; it reaches the caller only
    when the store stayed busy until the deadline.
    """


class InvalidLockBackend(LockError, ImproperlyConfigured):
    """``settings.LOCK_BACKEND`` names a backend or option that does not exist."""
