"""PostgreSQL from an event loop: psycopg's async connections, pooled per loop, and one listening session per loop.

The operations are the dialect's, written once as steps (its ``*_steps``
methods), the same the blocking path drives on its cursor; only the driver
differs (:meth:`LoopSessions.run`). Each event loop gets:

- a few sessions of its own (up to ``size``), each call borrowing one for
  one statement, so concurrent tasks run concurrent calls — no thread per
  call, none per waiter;
- a listening session on a channel named for the loop. The pooled sessions
  set ``esdlock.channel`` to it, so the waiting markers they write name it
  (migration 0004), and a release notifies this one session with the
  holder id of the waiter it may free: that task alone wakes. A task is
  registered before each attempt, so a notification that comes between
  its refusal and its wait is not lost.

A loop's connections belong to it: ``aclose()`` ends them from the loop;
``close()`` from another thread ends them on their loop if it still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from ....steps import Steps, adrive
from ..statements import on_async_cursor
from .queries import CLIENT_CHECK_SINCE, PostgresSQL

logger = logging.getLogger("django_esdlock")

T = TypeVar("T")


class LoopSessions:
    """The PostgreSQL sessions of one event loop: a small pool for calls and one session that listens."""

    def __init__(self, connect_params: dict[str, Any], size: int) -> None:
        self.connect_params = connect_params
        self.channel = f"esdlock_a{uuid.uuid4().hex[:20]}"  # an identifier: never from user data
        self._idle: list[Any] = []
        self._slots = asyncio.Semaphore(size)
        self._waiters: dict[str, asyncio.Event] = {}
        """Holder id of each request of this loop that may wait -> set when a release may free it."""
        self.waiting: set[str] = set()
        """Holder ids of the requests waiting on the listening session now."""
        self.notifications = 0
        """How many notifications the listening session received."""
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._closed = False

    # --- calls -----------------------------------------------------------

    async def _connect(self) -> Any:
        import psycopg

        connection = await psycopg.AsyncConnection.connect(**self.connect_params, autocommit=True)
        try:
            await connection.execute(PostgresSQL.SESSION)
            if connection.info.server_version >= CLIENT_CHECK_SINCE:
                await connection.execute(PostgresSQL.SESSION_CLIENT_CHECK)
            await connection.execute(PostgresSQL.SET_CHANNEL, [self.channel])
        except BaseException:
            await connection.close()
            raise
        return connection

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        """Borrow a session for one call; one that failed in any way is closed, not given back."""
        async with self._slots:
            connection = self._idle.pop() if self._idle else await self._connect()
            try:
                yield connection
            except BaseException:
                with contextlib.suppress(Exception):
                    await connection.close()
                raise
            if self._closed or connection.closed:
                await connection.close()
            else:
                self._idle.append(connection)

    async def run(self, steps: Steps[T]) -> T:
        """Drive an operation's steps on one session of this loop, borrowed for the whole operation."""
        async with self.session() as connection, connection.cursor() as cursor:
            return await adrive(steps, lambda step: on_async_cursor(cursor, step))

    # --- waking --------------------------------------------------------------

    def attempt_begins(self, holder_id: str) -> None:
        """A request that may wait tries: from now on a release that may free it wakes its next wait."""
        self._waiters[holder_id] = asyncio.Event()

    def done_waiting(self, holder_id: str) -> None:
        """The request was granted or gave up: nobody waits for its wake-ups any longer."""
        self._waiters.pop(holder_id, None)

    async def wait(self, holder_id: str, timeout: float) -> bool:
        """Wait until a release that may free ``holder_id`` is announced after its last attempt began.

        Returns once ``timeout`` has passed in any case. Returns False, at
        once, if this loop cannot listen (the caller then sleeps its
        backoff instead). While the loop only starts listening, this
        returns once it listens, without waiting for a release: one that
        came before LISTEN took effect was not heard, so the caller tries
        again.
        """
        if self._listener is None or self._listener.done():
            self._listening = asyncio.Event()
            self._listener = asyncio.ensure_future(self._listen_forever(self._listening))
        if not self._listening.is_set():
            listening = asyncio.ensure_future(self._listening.wait())
            try:
                await asyncio.wait([self._listener, listening], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                listening.cancel()
            return self._listening.is_set() and not self._listener.done()
        woken = self._waiters.setdefault(holder_id, asyncio.Event())
        self.waiting.add(holder_id)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout)
        finally:
            self.waiting.discard(holder_id)
        return True

    def _wake(self, holder_id: str) -> None:
        """A release names the waiter it may free; an empty name wakes every waiter of this loop."""
        if holder_id:
            woken = self._waiters.get(holder_id)
            if woken is not None:
                woken.set()
            return
        for woken in self._waiters.values():
            woken.set()

    async def _listen_forever(self, listening: asyncio.Event) -> None:
        import psycopg

        try:
            connection = await psycopg.AsyncConnection.connect(**self.connect_params, autocommit=True)
        except Exception as e:  # noqa: BLE001 - waiters poll meanwhile
            logger.info("async waiters poll, cannot listen for releases: %s", e)
            return
        try:
            await connection.execute(PostgresSQL.LISTEN.format(channel=self.channel))
            listening.set()
            async for notification in connection.notifies():
                self.notifications += 1
                self._wake(notification.payload)
        except Exception as e:  # noqa: BLE001 - waiters poll meanwhile, the next wait listens again
            logger.info("async waiters poll, listening for releases stopped: %s", e)
        finally:
            with contextlib.suppress(Exception):
                await connection.close()

    async def aclose(self) -> None:
        self._closed = True
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(BaseException):
                await self._listener
        idle, self._idle = self._idle, []
        for connection in idle:
            with contextlib.suppress(Exception):
                await connection.close()
