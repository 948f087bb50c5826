"""The database's store call, as a step (see ``django_esdlock.steps``): one SQL statement, and what to read of it."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any


class Fetch(enum.Enum):
    """What the result of a :class:`Statement` step is."""

    NOTHING = "nothing"
    ONE = "one"
    """The first row (None if there is none)."""
    ALL = "all"
    """Every row."""
    ROWCOUNT = "rowcount"
    """How many rows the statement changed."""


@dataclasses.dataclass(frozen=True)
class Statement:
    """Run ``sql`` with ``params`` (values only as parameters) on the operation's connection."""

    sql: str
    params: Any = ()
    fetch: Fetch = Fetch.NOTHING


def on_cursor(cursor: Any) -> Callable[[Statement], Any]:
    """The blocking ``perform`` of :func:`django_esdlock.steps.drive`: run each statement on ``cursor``."""

    def perform(step: Statement) -> Any:
        cursor.execute(step.sql, step.params)
        if step.fetch is Fetch.ONE:
            return cursor.fetchone()
        if step.fetch is Fetch.ALL:
            return cursor.fetchall()
        if step.fetch is Fetch.ROWCOUNT:
            return cursor.rowcount
        return None

    return perform


async def on_async_cursor(cursor: Any, step: Statement) -> Any:
    """:func:`on_cursor` for a driver's async cursor: run ``step`` on ``cursor`` and read what it asks."""
    await cursor.execute(step.sql, step.params)
    if step.fetch is Fetch.ONE:
        return await cursor.fetchone()
    if step.fetch is Fetch.ALL:
        return await cursor.fetchall()
    if step.fetch is Fetch.ROWCOUNT:
        return cursor.rowcount
    return None
