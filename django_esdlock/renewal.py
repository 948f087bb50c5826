"""The renewer: one thread per process that keeps the leases of every lock held here.

It reads and sets a few of each lock's private fields (its grant, when its
lease ends as its holder counts it, why it was lost): the lock and its
renewer are two halves of one thing, kept apart so that each reads alone.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from . import observability
from .backends.base import BaseLockBackend
from .exceptions import LockStoreBusy

BaseLock = Any
"""A ``core.BaseLock``: named, not imported (core imports this module)."""

logger = logging.getLogger("django_esdlock")


class RenewalWorkers:
    """Daemon threads that make the renewer's calls: an idle one takes the next call, else a new one starts.

    A thread ends after :attr:`IDLE` seconds without work. Several threads:
    a call that hangs ties up its own thread only. Reused threads, not one
    per call: the database backend keeps a connection per thread.
    """

    IDLE = 60.0

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tasks: collections.deque[Callable[[], None]] = collections.deque()
        self._idle = 0

    def submit(self, task: Callable[[], None]) -> None:
        with self._cond:
            self._tasks.append(task)
            if self._idle >= len(self._tasks):
                self._cond.notify()
                return
        threading.Thread(target=self._work, name="django-esdlock-renewal", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                try:
                    if not self._cond.wait_for(lambda: self._tasks, timeout=self.IDLE):
                        return
                    task = self._tasks.popleft()
                finally:
                    self._idle -= 1
            try:
                task()
            except BaseException:  # a task's failure is its own, the thread serves the next
                logger.exception("a lock renewal task failed")


class Renewer:
    """Keeps the leases of this process's held locks: one scheduling thread, the store calls in :class:`RenewalWorkers`.

    The locks due on one backend are renewed by one call (``renew_many``: one
    ``_bulk``, one statement), given a third of what is left of the shortest
    lease it serves; each call runs in a worker of its own, so one that hangs
    holds back no other lock's renewal. The scheduler marks a lock lost the
    moment its lease ends as its holder counts it (see
    ``BaseLockBackend.held_for``), whatever its call is doing: before any
    store node could judge the lease over and grant the lock again.
    """

    RETRY_DELAY = 0.5
    """Longest pause before a failed renewal is tried again (``TTL/6`` if shorter)."""

    FIRST_RENEWAL = 1.0
    """Seconds to the first renewal at most: it also records the fencing token with the holder."""

    BATCH_WINDOW = 0.1
    """A renewal due this many seconds from now (a tenth of its period at most) goes with those due now."""

    def __init__(self) -> None:
        self._after_fork()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._cond = threading.Condition()
        self._held: set[BaseLock] = set()
        self._due: dict[BaseLock, float] = {}
        """Held locks whose renewal is not running: when it is due."""
        self._renewing: dict[BaseLock, float] = {}
        """Locks whose renewal call runs: when that call gives up."""
        self._failures: dict[BaseLock, str] = {}
        """Why the last renewal of a lock failed, while it is retried."""
        self._thread: threading.Thread | None = None
        self._sleeping_until: float | None = None
        """When the scheduler wakes next while it waits; None while it works (it looks at every lock again)."""
        self._workers = RenewalWorkers()

    def add(self, lock: BaseLock, ttl: float) -> None:
        with self._cond:
            self._held.add(lock)
            due = self._due[lock] = time.monotonic() + min(ttl / 3, self.FIRST_RENEWAL)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="django-esdlock-renewer", daemon=True)
                self._thread.start()
            # Woken only if it would sleep past this renewal: a lock taken and let go again and again (its lease
            # ends later than its renewal is due) does not wake the scheduler each time.
            if self._sleeping_until is None or due < self._sleeping_until:
                self._cond.notify()

    def remove(self, lock: BaseLock, *, settle: bool = False) -> None:
        """Stop renewing ``lock``; with ``settle``, also wait until a renewal of it in flight has ended.

        The outcome of a renewal that ends after this is ignored. Waiting for
        it matters only when a write of ours must land after it (a hand-off's
        longer lease); it is not waited for past its own time limit.
        """
        with self._cond:
            self._held.discard(lock)
            self._due.pop(lock, None)
            self._failures.pop(lock, None)
            if settle and threading.current_thread() is not self._thread:
                gives_up = self._renewing.get(lock, 0.0)
                self._cond.wait_for(lambda: lock not in self._renewing, timeout=gives_up - time.monotonic())

    def _window(self, lock: BaseLock) -> float:
        return min(self.BATCH_WINDOW, lock._grant.request.ttl / 30) if lock._grant else 0.0

    def renewing(self, lock: BaseLock) -> bool:
        """Whether a renewal of ``lock`` is in flight now."""
        with self._cond:
            return lock in self._renewing

    def _run(self) -> None:
        while True:
            try:
                self._schedule()
            except BaseException:  # every other lock of the process depends on this thread
                logger.exception("the lock renewer failed; it goes on")
                time.sleep(self.RETRY_DELAY)

    def _schedule(self) -> None:
        """Start the renewals that are due and mark lost the locks whose lease ended; else sleep until one is."""
        with self._cond:
            now = time.monotonic()
            ended = [lock for lock in self._held if lock._lost_reason is None and lock._valid_until <= now]
            for lock in ended:
                self._due.pop(lock, None)
            due = [lock for lock, at in self._due.items() if at <= now + self._window(lock)]
            if not due and not ended:
                wake = min(
                    (*self._due.values(), *(lock._valid_until for lock in self._held if lock._lost_reason is None)),
                    default=now + 60,
                )
                self._sleeping_until = wake
                try:
                    self._cond.wait(timeout=max(wake - now, 0.001))
                finally:
                    self._sleeping_until = None
                return
            batches: dict[BaseLockBackend, list[BaseLock]] = {}
            due_at = {}
            for lock in due:
                due_at[lock] = self._due.pop(lock)
                batches.setdefault(lock.backend, []).append(lock)
            calls = []
            for backend, locks in batches.items():
                timeout = min(lock._call_timeout() for lock in locks)
                for lock in locks:
                    self._renewing[lock] = now + timeout
                calls.append(functools.partial(self._renew, backend, locks, timeout, due_at))
            failures = {lock: self._failures.pop(lock, None) for lock in ended}
        for call in calls:
            self._workers.submit(call)
        for lock, failure in failures.items():
            reason = "no renewal succeeded within its lease" + (f" (the last failed: {failure})" if failure else "")
            guarded(lock, lock._mark_lost, reason)

    def _renew(
        self,
        backend: BaseLockBackend,
        locks: list[BaseLock],
        timeout: float,
        due_at: dict[BaseLock, float] | None = None,
    ) -> None:
        """Renew ``locks`` in one call of at most ``timeout`` seconds; settle each lock's outcome.

        ``due_at``: when each renewal was due, to tell how late it runs.
        """
        started = time.monotonic()
        held = [(lock, lock.grant) for lock in locks if lock.grant is not None]  # not let go meanwhile
        outcomes: list[bool | None] = [None] * len(held)
        failure = "the store was busy"
        error: Exception | None = None
        try:
            outcomes = list(backend.renew_many([grant for _, grant in held], timeout=timeout))
            if len(outcomes) != len(held):
                raise TypeError(f"{type(backend).__name__}.renew_many answered {len(outcomes)} of {len(held)} grants")
        except Exception as e:  # noqa: BLE001 - any failure is retried until the lease is gone
            outcomes, failure, error = [None] * len(held), f"{type(e).__name__}: {e}", e
        failed = "error" if error is not None and not isinstance(error, LockStoreBusy) else "busy"
        for (lock, _), outcome in zip(held, outcomes, strict=True):
            lag = None if due_at is None or lock not in due_at else started - due_at[lock]
            observability.renewal(backend, failed if outcome is None else "ok" if outcome else "lost", lag)
            guarded(lock, self._settle, lock, outcome, started, failure)
        settled = {lock for lock, _ in held}
        for lock in locks:
            if lock not in settled:  # let go meanwhile: no longer in flight
                guarded(lock, self._settle, lock, None, started, failure)

    def _settle(self, lock: BaseLock, renewed: bool | None, started: float, failure: str) -> None:
        """Record the outcome of one lock's renewal, unless it was let go or lost meanwhile."""
        with self._cond:
            self._renewing.pop(lock, None)
            self._cond.notify_all()
            if lock not in self._held or lock._lost_reason is not None:
                return  # released, handed off or already told: the outcome is nobody's news
            if lock._valid_until <= time.monotonic():
                self._cond.notify()  # too late to count: the scheduler tells its holder
                return
            if renewed is None:
                self._failures[lock] = failure
                ttl = lock._grant.request.ttl if lock._grant else 0.0
                self._due[lock] = time.monotonic() + min(self.RETRY_DELAY, ttl / 6)
                self._cond.notify()
            elif renewed:
                self._failures.pop(lock, None)
                lock._renewed(started)
                ttl = lock._grant.request.ttl if lock._grant else 0.0
                self._due[lock] = time.monotonic() + ttl / 3
                self._cond.notify()
        if renewed is None:
            logger.info("renewing %r failed, retrying within its lease: %s", lock, failure)
        elif not renewed:
            lock._mark_lost("its holder record was gone or expired at renewal")


def guarded(lock: BaseLock, call: Callable[..., None], *args: Any) -> None:
    """Run ``call`` for ``lock``; whatever it raises (a receiver's SystemExit too) is logged, and ends nothing else."""
    try:
        call(*args)
    except BaseException:  # the renewer's threads serve every lock of the process
        logger.exception("the lock renewer could not settle %r", lock)


renewer = Renewer()
