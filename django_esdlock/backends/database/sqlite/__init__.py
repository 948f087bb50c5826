"""The SQLite dialect of the database lock backend: the zero-setup embedded default."""

from .dialect import SQLiteDialect

__all__ = ["SQLiteDialect"]
