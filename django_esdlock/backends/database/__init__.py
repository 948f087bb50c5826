"""The database lock backend (PostgreSQL, SQLite): ``DatabaseLockBackend``.

``backend.py`` is the shared backend, ``dialect.py`` what a vendor declares
and implements; each vendor is a package (``postgresql/``, ``sqlite/``).
"""

from .backend import DatabaseLockBackend

__all__ = ["DatabaseLockBackend"]
