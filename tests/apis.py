"""The two lock APIs behind one face, so that one contract suite proves both.

``SYNC`` is the blocking API itself. ``ASYNC`` drives the async API
(``alock_tree``...) on an event loop in a thread of its own: each thread of
the test gets one asyncio task there that runs its calls in order, so that
"the same thread" of a blocking test is "the same task" of the async API
(self-deadlock detection and document-lock reentrancy are per task).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from django_esdlock import aio, locks

CALL_TIMEOUT = 120.0
"""Seconds one call may take before the test fails (a lock wait is bounded by its own timeout first)."""


class SyncApi:
    Lock = locks.Lock
    lock_tree = staticmethod(locks.lock_tree)
    global_lock = staticmethod(locks.global_lock)
    lock_documents = staticmethod(locks.lock_documents)
    semaphore = staticmethod(locks.semaphore)


class _TaskPerThread:
    """An event loop in a daemon thread, with one task per calling thread that runs its calls in order."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._queues: dict[int, asyncio.Queue[Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._guard = threading.Lock()
        threading.Thread(target=self._loop.run_forever, name="async-api-loop", daemon=True).start()

    async def _serve(self, queue: asyncio.Queue[Any]) -> None:
        while True:
            call, future = await queue.get()
            try:
                result = await call()
            except BaseException as e:  # noqa: BLE001 - handed to the calling thread
                future.set_exception(e)
            else:
                future.set_result(result)

    def _queue(self) -> asyncio.Queue[Any]:
        with self._guard:
            queue = self._queues.get(threading.get_ident())
            if queue is None:

                async def start() -> asyncio.Queue[Any]:
                    queue: asyncio.Queue[Any] = asyncio.Queue()
                    self._tasks.add(asyncio.ensure_future(self._serve(queue)))
                    return queue

                queue = asyncio.run_coroutine_threadsafe(start(), self._loop).result(CALL_TIMEOUT)
                self._queues[threading.get_ident()] = queue
            return queue

    def run(self, call: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Run ``call()`` in this thread's task and return what it returns (or raise what it raises)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        queue = self._queue()
        self._loop.call_soon_threadsafe(queue.put_nowait, (call, future))
        return future.result(CALL_TIMEOUT)


_runner: _TaskPerThread | None = None
_runner_made = threading.Lock()
"""Two threads that call first at once must share one loop: with two, one owner's calls would run in two tasks."""


def _run(call: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    global _runner
    with _runner_made:
        if _runner is None:
            _runner = _TaskPerThread()
    return _runner.run(call)


class _Blocking(contextlib.ContextDecorator):
    """An AsyncLock used from blocking code: each method awaits its twin in the calling thread's task."""

    def __init__(self, lock: aio.AsyncLock) -> None:
        self.lock = lock

    def _recreate_cm(self) -> _Blocking:
        return _Blocking(self.lock._recreate_cm())

    def acquire(self) -> _Blocking:
        _run(self.lock.acquire)
        return self

    def release(self) -> None:
        _run(self.lock.release)

    def checkpoint(self, data: Any) -> None:
        _run(lambda: self.lock.checkpoint(data))

    def __enter__(self) -> _Blocking:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        _run(lambda: self.lock.__aexit__(*exc))

    def __getattr__(self, name: str) -> Any:  # token, holder_id, lost, grant, check, ...
        return getattr(self.lock, name)


def _blocking(factory: Callable[..., aio.AsyncLock]) -> Callable[..., _Blocking]:
    return lambda *args, **kwargs: _Blocking(factory(*args, **kwargs))


class AsyncApi:
    Lock = staticmethod(_blocking(aio.AsyncLock))
    lock_tree = staticmethod(_blocking(aio.alock_tree))
    global_lock = staticmethod(_blocking(aio.aglobal_lock))
    lock_documents = staticmethod(_blocking(aio.alock_documents))
    semaphore = staticmethod(_blocking(aio.asemaphore))
