"""Exceptions raised by django-esdlock."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class LockError(Exception):
    """Base class of every django-esdlock error; do not raise directly."""


class LockUnavailable(LockError):
    """The lock is held in a conflicting mode and the caller would not wait."""


class LockTimeout(LockUnavailable):
    """The lock stayed unavailable for the whole timeout."""


class LockLost(LockError):
    """The lease ran out or the holder record vanished: the lock is no longer held."""


class LockDeadlock(LockError):
    """The calling thread would wait for a lock that it holds itself."""


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
