"""Locks for coroutines: ``async with alock_tree(...)``, the twins of the blocking API in ``locks.py``.

The waiting loop, the request and the bookkeeping are the blocking Lock's
(:class:`~django_esdlock.core.BaseLock`); only the driver differs
(:func:`~django_esdlock.steps.adrive`): each step is awaited, so a waiting task sleeps on the event loop and ties up no
thread. Leases are renewed by the process's renewer thread, as for blocking
locks, so a lock held across ``await`` points stays renewed even while the
loop is busy elsewhere (or blocked).

Cancellation never leaves a lock half held: a try the task was cancelled in
is let finish (shielded), and a grant it brings back after the cancel is
given back before the ``CancelledError`` goes on; a task cancelled while
holding still releases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, TypeVar

from . import observability
from .backends.base import BaseLockBackend
from .core import (
    BaseLock,
    aread_wait_state,
    document_targets,
    global_targets,
    semaphore_targets,
    tree_targets,
    validate_limit,
    validate_ttl,
)
from .records import Grant, LockRequest
from .renewal import renewer
from .steps import TRY, LookForDeadlock, adrive

logger = logging.getLogger("django_esdlock")

T = TypeVar("T")


async def _settle(future: asyncio.Future[Any]) -> bool:
    """Wait until ``future`` is done, whatever cancels the caller meanwhile; return True if something did."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait([future])  # unlike awaiting it, a cancelled wait leaves the future running
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


async def shielded(work: Awaitable[T]) -> T:
    """Run ``work`` to its end whatever happens to the caller; a cancel of the caller is raised after it."""
    future = asyncio.ensure_future(work)
    if await _settle(future):
        future.exception()  # retrieved: the cancel is what goes on
        raise asyncio.CancelledError
    return future.result()


async def _stop_renewing(lock: BaseLock) -> None:
    """Stop renewing ``lock`` for a hand-off; a renewal of it in flight ends first, waited for in a thread.

    Landing after the hand-off's renewal, it would cut the ticket's lease short.
    """
    renewer.remove(lock)  # no renewal of it starts from here on
    if renewer.renewing(lock):
        await asyncio.to_thread(renewer.remove, lock, settle=True)


class AsyncLock(BaseLock, contextlib.AsyncContextDecorator):
    """A lock for coroutines: ``async with``, or a decorator of coroutine functions (each call acquires anew)."""

    def _recreate_cm(self) -> AsyncLock:
        return type(self)(
            self.targets,
            timeout=self.timeout,
            ttl=self.ttl,
            intent=self.intent,
            reentrant=self.reentrant,
            holder_limit=self.holder_limit,
            backend=self._backend,
        )

    async def acquire(self) -> AsyncLock:
        """Take the lock, waiting as ``timeout`` says; return self."""
        with observability.acquiring(self):
            return await self._acquire()

    async def _acquire(self) -> AsyncLock:
        backend, request = self._start()
        granted: list[Grant] = []  # a grant that came back before an error: given back

        async def perform(step: Any) -> Any:
            if step is TRY:
                grant = await self._try(backend, request)
                if grant is not None:
                    granted.append(grant)
                return grant
            if isinstance(step, LookForDeadlock):
                return await aread_wait_state(backend, step.nodes)
            return await backend.await_release(request, step.seconds, step.attempt)

        try:
            grant, started = await adrive(self._attempts(backend, request), perform)
        except BaseException:
            for grant in granted:
                await self._give_back(backend, grant)
            if request.ticket is not None:
                with contextlib.suppress(Exception):  # the markers expire by themselves anyway
                    await shielded(backend.awithdraw(request))
            raise
        await self._hold_or_give_back(backend, grant, started)
        return self

    async def _hold_or_give_back(self, backend: BaseLockBackend, grant: Grant, started: float) -> None:
        """:meth:`_hold` the grant; if that fails, give it back to the store before the error goes on."""
        try:
            self._hold(grant, started)
        except BaseException:
            await self._give_back(backend, grant)
            raise

    @staticmethod
    async def _give_back(backend: BaseLockBackend, grant: Grant) -> None:
        """Release a grant that never reached the caller (even if cancelled meanwhile), best-effort."""
        try:
            await shielded(backend.arelease(grant))
        except Exception:  # the error that made us give it back is the one to see
            logger.warning("could not give back a grant of %s", grant.taken[-1:] or "nothing", exc_info=True)

    @staticmethod
    async def _try(backend: BaseLockBackend, request: LockRequest) -> Grant | None:
        """One try of the backend's acquire; cancelled during it, give back what it brings, then re-raise."""
        attempt = asyncio.ensure_future(backend.aacquire(request))
        if await _settle(attempt):
            grant = None if attempt.exception() else attempt.result()
            if grant is not None:
                with contextlib.suppress(Exception):
                    await shielded(backend.arelease(grant))
            raise asyncio.CancelledError
        return attempt.result()

    async def release(self) -> None:
        """Give the lock back (even if the task is cancelled meanwhile); raise LockLost if it had been lost."""
        grant = self._grant
        if grant is None or self._forget_inherited():
            return

        async def let_go() -> tuple[bool, bool]:
            lost = self._letting_go()
            return lost, await self.backend.arelease(grant)

        try:
            was_lost, still_held = await shielded(let_go())
        finally:
            self._grant = None
        self._released(still_held, was_lost)

    async def checkpoint(self, data: Mapping[str, Any]) -> None:
        """Record how far the work under this lock got (and renew the lease)."""
        checkpoint = self._checkpoint_data(data)
        self.check()
        assert self._grant is not None
        started = time.monotonic()
        if not await self.backend.arenew(self._grant, checkpoint=checkpoint, timeout=self._call_timeout()):
            self._mark_lost("its holder record was gone at checkpoint")
            self.check()
        self._checkpoint = checkpoint
        self._renewed(started)
        observability.checkpointed(self)

    async def handoff(self, ttl: float | None = None) -> str:
        """Async :meth:`Lock.handoff <django_esdlock.Lock.handoff>`: return a ticket for ``aresume_lock``."""
        ttl = validate_ttl(ttl)
        self.check()
        timeout = self._call_timeout()
        try:
            await shielded(_stop_renewing(self))
        except BaseException:  # cancelled: the lock stays ours, renewed as before
            if self._grant is not None:
                renewer.add(self, self._grant.request.ttl)
            raise
        renewed = self._handoff_start(ttl, settle=False)
        try:
            ok = await shielded(self.backend.arenew(renewed, timeout=timeout))
        except BaseException:
            self._handoff_failed()
            raise
        return self._handed(renewed, ok)

    async def __aenter__(self) -> AsyncLock:
        return await self.acquire()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.release()
            return
        try:
            await self.release()
        except Exception:
            # The block's own exception is the one to see; the lease ends the lock anyway.
            logger.warning("releasing %r after %s failed", self, exc_type.__name__, exc_info=True)


def alock_tree(
    path: str,
    *,
    shared: bool = False,
    timeout: float | None = None,
    ttl: float | None = None,
    namespace: str = "default",
    intent: Mapping[str, Any] | None = None,
    backend: BaseLockBackend | None = None,
) -> AsyncLock:
    """Async :func:`~django_esdlock.lock_tree`: X on ``path`` (S if ``shared``), IX (IS) on its ancestors."""
    targets = tree_targets(path, shared=shared, namespace=namespace, intent=intent)
    return AsyncLock(targets, timeout=timeout, ttl=ttl, intent=intent, backend=backend)


def aglobal_lock(
    name: str = "global",
    *,
    timeout: float | None = None,
    ttl: float | None = None,
    backend: BaseLockBackend | None = None,
) -> AsyncLock:
    """Async :func:`~django_esdlock.global_lock`."""
    return AsyncLock(global_targets(name), timeout=timeout, ttl=ttl, backend=backend)


def alock_documents(
    ids: Iterable[str],
    *,
    namespace: str = "default",
    timeout: float | None = None,
    ttl: float | None = None,
    backend: BaseLockBackend | None = None,
) -> AsyncLock:
    """Async :func:`~django_esdlock.lock_documents`: ids this task holds already are kept."""
    return AsyncLock(
        document_targets(ids, namespace=namespace), timeout=timeout, ttl=ttl, reentrant=True, backend=backend
    )


def asemaphore(
    name: str,
    limit: int,
    *,
    namespace: str = "default",
    timeout: float | None = None,
    ttl: float | None = None,
    intent: Mapping[str, Any] | None = None,
    backend: BaseLockBackend | None = None,
) -> AsyncLock:
    """Async :func:`~django_esdlock.semaphore`: one of ``limit`` slots of ``name``, served in order."""
    targets = semaphore_targets(name, namespace=namespace)
    return AsyncLock(
        targets, timeout=timeout, ttl=ttl, intent=intent, holder_limit=validate_limit(limit), backend=backend
    )
