"""Waking a waiter on PostgreSQL: its own lock session listens, and the waiting thread blocks on that socket.

A waiting request's markers name the channel of the session that wrote them
(``esdlock_<backend pid>``); a release that may free a waiter notifies that
channel only, at its commit. The waiting thread then reads its own
connection's socket: no relay thread, no shared listening connection, so a
hand-over costs the release's commit, one message, and the next acquire.

A session starts listening on its first refused attempt and stays so for its
life. Starting costs a round trip, after which the request tries again at
once: a release that came before LISTEN took effect was not heard, and the
next attempt sees it. Every later release is heard, because a refused
attempt that writes a marker takes a key share lock on the grants that
refuse it: their release waits for that marker to commit, and sees it.
Notifications a session receives while it is busy are kept by psycopg and
end its next wait at once (an extra attempt, never a missed wake-up).
"""

from __future__ import annotations

from typing import Any

from .queries import CHANNEL_PREFIX, PostgresSQL


def channel(wrapper: Any) -> str:
    """The channel this session's markers name (see ``esdlock_acquire``)."""
    return f"{CHANNEL_PREFIX}{wrapper.connection.info.backend_pid}"


def listening(wrapper: Any) -> bool:
    """Whether this lock session already listens on its channel."""
    return wrapper.connection is not None and getattr(wrapper, "_esdlock_listening", None) is wrapper.connection


def listen(wrapper: Any, cursor: Any) -> None:
    """Make this lock session listen on its channel (autocommit: in effect when this returns)."""
    cursor.execute(PostgresSQL.LISTEN.format(channel=channel(wrapper)), [])
    wrapper._esdlock_listening = wrapper.connection


def wait(wrapper: Any, timeout: float) -> bool:
    """Block on this session's socket until a notification comes (True) or ``timeout`` passes (False)."""
    for _ in wrapper.connection.notifies(timeout=max(0.0, timeout), stop_after=1):
        return True
    return False
