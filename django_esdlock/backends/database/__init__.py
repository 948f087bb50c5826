"""The database lock backend (PostgreSQL, SQLite): ``DatabaseLockBackend``."""

from . import listener
from .backend import DatabaseLockBackend

__all__ = ["DatabaseLockBackend", "listener"]
