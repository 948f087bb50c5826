"""Locks shared through Elasticsearch or a SQL database: tree, document, global and semaphores."""

from .aio import AsyncLock, aglobal_lock, alock_documents, alock_tree, asemaphore
from .conf import get_backend
from .exceptions import (
    InvalidLockArgument,
    InvalidLockBackend,
    InvalidLockPath,
    LockBackendUnavailable,
    LockDeadlock,
    LockError,
    LockLost,
    LockStoreBusy,
    LockTimeout,
    LockUnavailable,
    StaleFence,
)
from .handoff import aresume_lock, resume_lock
from .locks import Lock, global_lock, lock_documents, lock_tree, semaphore
from .modes import Mode
from .tasks import locked
from .version import VERSION

__all__ = [
    "AsyncLock",
    "InvalidLockArgument",
    "InvalidLockBackend",
    "InvalidLockPath",
    "Lock",
    "LockBackendUnavailable",
    "LockDeadlock",
    "LockError",
    "LockLost",
    "LockStoreBusy",
    "LockTimeout",
    "LockUnavailable",
    "Mode",
    "StaleFence",
    "aglobal_lock",
    "alock_documents",
    "alock_tree",
    "aresume_lock",
    "asemaphore",
    "get_backend",
    "global_lock",
    "lock_documents",
    "lock_tree",
    "locked",
    "resume_lock",
    "semaphore",
]

__version__ = VERSION
