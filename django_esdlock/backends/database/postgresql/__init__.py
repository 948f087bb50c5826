"""The PostgreSQL dialect of the database lock backend: its statements, functions, listener and async sessions."""

from .dialect import PostgresDialect

__all__ = ["PostgresDialect"]
