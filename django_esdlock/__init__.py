"""Locks shared through Elasticsearch or a SQL database: tree, document and global."""

from .aio import AsyncLock, aglobal_lock, alock_documents, alock_tree
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
from .locks import Lock, global_lock, lock_documents, lock_tree
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
    "get_backend",
    "global_lock",
    "lock_documents",
    "lock_tree",
    "locked",
    "resume_lock",
]

__version__ = VERSION
