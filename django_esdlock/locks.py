"""Lock objects: waiting, deadlock detection, lease renewal and release."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

from . import signals
from .backends.base import BaseLockBackend, backoff_delay
from .conf import get_backend
from .deadlock import confirmed, find_cycle
from .exceptions import (
    InvalidLockArgument,
    LockBackendUnavailable,
    LockDeadlock,
    LockLost,
    LockStoreBusy,
    LockTimeout,
    LockUnavailable,
)
from .forks import ForkSafeLock
from .modes import Mode, compatible
from .paths import ancestors, normalize_key, normalize_namespace, normalize_path
from .records import Grant, Kind, LockRequest, Node, Owner, Targets, current_task
from .tickets import Ticket, names

logger = logging.getLogger("django_esdlock")


def _validate_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        raise InvalidLockArgument(f"timeout must be None, 0 or a positive number of seconds, not {timeout!r}")
    return float(timeout)


def _validate_ttl(ttl: Any) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
        raise InvalidLockArgument(f"ttl must be None or a positive number of seconds, not {ttl!r}")
    return float(ttl)


def _validate_json(value: Any, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidLockArgument(f"{what} must be a dict, not {type(value).__name__}")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidLockArgument(f"{what} must be JSON-serializable: {e}") from e


@dataclasses.dataclass(frozen=True)
class _Sleep:
    seconds: float


@dataclasses.dataclass(frozen=True)
class _Wait:
    seconds: float
    attempt: int


@dataclasses.dataclass(frozen=True)
class _Look:
    """Read the waiting state of the store (of ``nodes`` only, when given) for deadlock detection."""

    nodes: tuple[Node, ...] | None = None


_TRY = object()
"""The waiting loop's step "send the request to the backend"."""

_UNSUPPORTED = object()
"""The outcome of a _Look on a store that cannot list waiting requests."""

_Step = Any  # _TRY, _Sleep, _Wait or _Look


class BaseLock:
    """One acquisition of a set of (node, mode) pairs, all or nothing: what Lock and AsyncLock share.

    While held, a background renewer keeps the lease alive; if that fails the
    lock is *lost*: :attr:`lost` turns True, :meth:`check` raises LockLost and
    so does the release. A lock belongs to the process that took it: in a
    forked child it is not held, and its release there touches nothing.
    """

    def __init__(
        self,
        targets: Targets,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        intent: Mapping[str, Any] | None = None,
        reentrant: bool = False,
        backend: BaseLockBackend | None = None,
    ) -> None:
        self.targets = targets
        self.timeout = _validate_timeout(timeout)
        self.ttl = _validate_ttl(ttl)
        self.intent = _validate_json(intent, "intent")
        if self.intent is not None and not isinstance(self.intent.get("op"), str):
            raise InvalidLockArgument("intent must have an 'op' string naming its recovery handler")
        self.reentrant = reentrant
        self._backend = backend
        self._grant: Grant | None = None
        self._pid: int | None = None
        """The process that took the grant: a forked child inherits the object, not the lock."""
        self._valid_until = 0.0
        """When the lease ends as this holder counts it (``time.monotonic()``): before any store node could."""
        self._lost_reason: str | None = None
        self._checkpoint: dict[str, Any] | None = None
        self._handed_off = False

    def __repr__(self) -> str:
        if self._inherited:
            state = f"of process {self._pid}"
        elif self.held:
            state = "held"
        else:
            state = "lost" if self._lost_reason else "handed off" if self._handed_off else "not held"
        nodes = ", ".join(f"{node}={mode}" for node, mode in self.targets[-3:])
        return f"<{type(self).__name__} {nodes} {state} token={self.token}>"

    # --- state ------------------------------------------------------------

    @property
    def backend(self) -> BaseLockBackend:
        return self._backend or get_backend()

    @property
    def grant(self) -> Grant | None:
        return self._grant

    @property
    def held(self) -> bool:
        return self._grant is not None and not self.lost

    @property
    def _inherited(self) -> bool:
        """True in a process forked while this lock was held: the grant is its parent's."""
        return self._grant is not None and self._pid != os.getpid()

    @property
    def token(self) -> int | None:
        """The fencing token of this grant: larger than any earlier grant's in its namespace."""
        return self._grant.token if self._grant else None

    @property
    def holder_id(self) -> str | None:
        return self._grant.request.holder_id if self._grant else None

    @property
    def lost(self) -> bool:
        """True once the lease could not be kept; the lock protects nothing then."""
        if self._lost_reason is not None:
            return True
        return self._grant is not None and (self._inherited or time.monotonic() > self._valid_until)

    @property
    def last_checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint this lock recorded last (a resumed lock: the one its ticket carried)."""
        return self._checkpoint

    @property
    def handed_off(self) -> bool:
        """True once :meth:`handoff` gave the lock to whoever claims its ticket; it protects nothing here then."""
        return self._handed_off

    def check(self) -> None:
        """Raise LockLost unless the lock is held with a live lease."""
        if self._handed_off:
            raise LockLost(f"{self!r} was handed off: the worker that claims its ticket holds it")
        if self._grant is None and self._lost_reason is None:
            raise LockLost(f"{self!r} is not held")
        if self._inherited:
            raise LockLost(f"{self!r} was taken by process {self._pid} before a fork: this process does not hold it")
        if self.lost:
            raise LockLost(f"{self!r} was lost: {self._lost_reason or 'its lease ran out before a renewal'}")

    # --- acquisition --------------------------------------------------------

    def _start(self) -> tuple[BaseLockBackend, LockRequest]:
        """Check the lock may be taken by the caller; return the backend and the request to send."""
        if self._grant is not None:
            raise RuntimeError(f"{self!r} is already acquired; create a new lock object")
        backend = self.backend
        backend.limits.check_intent(self.intent)
        documents = sum(node.kind is Kind.DOCUMENT for node, _ in self.targets)
        if documents:
            backend.limits.check_ids(documents)
        _check_self_deadlock(self)
        reentered = _held_here(self) if self.reentrant else frozenset()
        request = LockRequest(
            holder_id=uuid.uuid4().hex,
            owner=Owner.current(),
            targets=self.targets,
            ttl=self.ttl or backend.ttl,
            intent=self.intent,
            reentrant=bool(reentered),
            reentered=reentered or None,
            # A request that may wait queues from its first refusal (fair
            # waiting): its markers make newcomers wait behind it at once, so
            # its wait is bounded by the holds already there when it came.
            ticket=None if self.timeout == 0 else time.time_ns(),
            holds_others=bool(_registry.of_current_holder()),
        )
        return backend, request

    def _attempts(
        self, backend: BaseLockBackend, request: LockRequest
    ) -> Generator[_Step, Grant | LockStoreBusy | None, tuple[Grant, float]]:
        """Try, wait and try again until granted or the timeout; return the grant and when its try began."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        attempt = busy_attempt = 0
        # An owner that holds nothing is never a deadlock's victim (see deadlock.Cycle.victim): no look.
        deadlock_timeout = backend.deadlock_timeout if request.holds_others else None
        next_look: float | None = None
        while True:
            started = time.monotonic()
            outcome = yield _TRY
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if isinstance(outcome, LockStoreBusy):
                # Turned away for now (429, 503): nothing was granted; try again within the deadline.
                if remaining <= 0:
                    raise outcome
                yield _Sleep(min(remaining, backoff_delay(busy_attempt, cap=1.0)))
                busy_attempt += 1
                continue
            if outcome is not None:
                return outcome, started
            if self.timeout == 0:
                reason = backend.refusal_reason(request) or "is held in a conflicting mode"
                raise LockUnavailable(f"{self._describe()} {reason}")
            if remaining <= 0:
                reason = backend.refusal_reason(request)
                raise LockTimeout(
                    f"{self._describe()} stayed unavailable for {self.timeout:g}s{': ' + reason if reason else ''}"
                )
            pause = min(remaining, backend.queued_poll_interval(request))
            if deadlock_timeout is not None:
                # Look for a cycle once this request has waited deadlock_timeout, and each period after.
                if next_look is None:
                    next_look = time.monotonic() + deadlock_timeout
                elif time.monotonic() >= next_look:
                    if not (yield from self._look_for_deadlock(request)):
                        deadlock_timeout = None  # the store cannot tell: wait as before
                        continue
                    next_look = time.monotonic() + deadlock_timeout
                pause = min(pause, max(0.0, next_look - time.monotonic()))
            # A queued request polls often: everyone behind it waits for its turn.
            yield _Wait(pause, attempt)
            attempt += 1

    def _look_for_deadlock(self, request: LockRequest) -> Generator[_Step, Any, bool]:
        """Raise LockDeadlock if ``request`` is the victim of a confirmed cycle; False: the store cannot tell."""
        state = yield _Look()
        if state is _UNSUPPORTED:
            return False
        if state is None:  # the store failed this time: look again later
            return True
        cycle = find_cycle(state, request.holder_id)
        if cycle is None or cycle.victim.holder_id != request.holder_id:
            return True  # no cycle, or another member gives up
        again = yield _Look(cycle.nodes)
        if again is None or again is _UNSUPPORTED or not confirmed(cycle, again):
            return True
        logger.warning("deadlock: %s gives up: %s", self._describe(), cycle.describe())
        raise LockDeadlock(f"{self._describe()} is the youngest request of a deadlock: {cycle.describe()}", cycle=cycle)

    def _hold(self, grant: Grant, started: float) -> None:
        """Become the holder of ``grant``: renewed from now on, known to deadlock detection.

        If anything fails here, nothing of it stays registered; the caller
        gives the grant back to the store.
        """
        self._grant = grant
        self._pid = os.getpid()
        self._lost_reason = None
        self._valid_until = started + self.backend.held_for(grant.request.ttl)
        try:
            _registry.add(self)
            _renewer.add(self, grant.request.ttl)
            logger.debug("acquired %r", self)
            signals.send(signals.lock_acquired, sender=type(self), lock=self)
        except BaseException:
            _renewer.remove(self)
            _registry.remove(self)
            self._grant = None
            raise

    def _forget_inherited(self) -> bool:
        """In a forked child, drop the parent's grant without touching the store; return True if it did."""
        if not self._inherited:
            return False
        logger.debug("not releasing %r in process %s: its parent holds it", self, os.getpid())
        self._grant = None
        return True

    def _call_timeout(self) -> float:
        """Seconds a store call that serves this lock's lease may take: a third of what is left of it."""
        return max(0.0, self._valid_until - time.monotonic()) / 3

    def _letting_go(self) -> tuple[bool, bool]:
        """Stop renewing before a release; return whether the lock was lost, and whether that was signalled.

        A renewal in flight is not waited for: its outcome is ignored from now on.
        """
        _renewer.remove(self)
        _registry.remove(self)
        return self.lost, self._lost_reason is not None

    def _released(self, still_held: bool, was_lost: bool, already_signalled: bool) -> None:
        """Signal the release; raise LockLost if the lock had been lost before it."""
        if not still_held and self._lost_reason is None:
            self._lost_reason = "its holder record was gone at release"
        if self._lost_reason is None and was_lost:
            self._lost_reason = "its lease ran out before a renewal"
        logger.debug("released %r", self)
        signals.send(signals.lock_released, sender=type(self), lock=self)
        if self._lost_reason is not None:
            if not already_signalled:  # the renewer sent it when it noticed
                signals.send(signals.lock_lost, sender=type(self), lock=self, reason=self._lost_reason)
            raise LockLost(f"{self!r} was lost before release: {self._lost_reason}")

    # --- hand-off (see handoff.py): the twins' handoff() call these around one renewal

    def _handoff_start(self, ttl: float | None, *, settle: bool = True) -> Grant:
        """Stop renewing for a hand-off; return the grant as the renewal that sets the ticket's lease sends it.

        ``settle=False``: the caller has let a renewal in flight end already.
        """
        ttl = _validate_ttl(ttl)
        self.check()
        grant = self._grant
        assert grant is not None
        # Settled: a renewal in flight must not land after ours (it would cut the
        # ticket's lease short) nor after the claim (it would report the lock lost).
        _renewer.remove(self, settle=settle)
        _registry.remove(self)
        if ttl is None:
            return grant
        return dataclasses.replace(grant, request=dataclasses.replace(grant.request, ttl=ttl))

    def _handoff_failed(self) -> None:
        """The renewal of a hand-off raised: the lock is still ours, renewed as before."""
        assert self._grant is not None
        _registry.add(self)
        _renewer.add(self, self._grant.request.ttl)

    def _handed(self, renewed: Grant, ok: bool) -> str:
        """Finish a hand-off whose renewal answered ``ok``: return the ticket, or raise LockLost."""
        if not ok:
            self._mark_lost("its holder record was gone or expired at hand-off")
            self.check()
        original = self._grant
        assert original is not None
        ticket = Ticket.of(renewed, ttl=original.request.ttl, checkpoint=self._checkpoint)
        if ticket.held_apart:
            logger.warning(
                "handed off holder %s without %s, held by its owner under another lock: its ticket does not "
                "cover them (resume_lock, and a task that names them, refuse it)",
                renewed.request.holder_id,
                names(ticket.held_apart),
            )
        self._grant = None
        self._handed_off = True
        logger.debug("handed off %r for %gs", self, renewed.request.ttl)
        return ticket.encode()

    def _renewed(self, started: float) -> None:
        if self._grant is not None:
            lease = self.backend.held_for(self._grant.request.ttl)
            self._valid_until = max(self._valid_until, started + lease)

    def _mark_lost(self, reason: str) -> None:
        if self._lost_reason is None:
            self._lost_reason = reason
            logger.warning("lost %r: %s", self, reason)
            signals.send(signals.lock_lost, sender=type(self), lock=self, reason=reason)

    def _checkpoint_data(self, data: Mapping[str, Any]) -> dict[str, Any] | None:
        """Return ``data`` as the checkpoint to record, or raise InvalidLockArgument (nothing sent)."""
        checkpoint = _validate_json(data, "checkpoint")
        self.backend.limits.check_checkpoint(checkpoint)
        return checkpoint

    def _describe(self) -> str:
        node, mode = self.targets[-1]
        more = f" (+{len(self.targets) - 1} more)" if len(self.targets) > 1 else ""
        return f"{node} in mode {mode}{more}"


class Lock(BaseLock, contextlib.ContextDecorator):
    """A lock for blocking code: a context manager, or a decorator (each call acquires anew)."""

    def _recreate_cm(self) -> Lock:
        return type(self)(
            self.targets,
            timeout=self.timeout,
            ttl=self.ttl,
            intent=self.intent,
            reentrant=self.reentrant,
            backend=self._backend,
        )

    def acquire(self) -> Lock:
        """Take the lock, waiting as ``timeout`` says; return self."""
        backend, request = self._start()
        steps = self._attempts(backend, request)
        granted: Grant | None = None
        try:
            step = next(steps)
            while True:
                if step is _TRY:
                    try:
                        outcome: Any = backend.acquire(request)
                    except LockStoreBusy as e:
                        outcome = e
                    if isinstance(outcome, Grant):
                        granted = outcome
                elif isinstance(step, _Sleep):
                    time.sleep(step.seconds)
                    outcome = None
                elif isinstance(step, _Look):
                    outcome = read_wait_state(backend, step.nodes)
                else:
                    backend.wait_release(request, step.seconds, step.attempt)
                    outcome = None
                step = steps.send(outcome)
        except StopIteration as done:
            grant, started = done.value
        except BaseException:
            if granted is not None:
                self._give_back(backend, granted)
            if request.ticket is not None:
                with contextlib.suppress(Exception):  # the markers expire by themselves anyway
                    backend.withdraw(request)
            raise
        self._hold_or_give_back(backend, grant, started)
        return self

    def _hold_or_give_back(self, backend: BaseLockBackend, grant: Grant, started: float) -> None:
        """:meth:`_hold` the grant; if that fails, give it back to the store before the error goes on."""
        try:
            self._hold(grant, started)
        except BaseException:
            self._give_back(backend, grant)
            raise

    @staticmethod
    def _give_back(backend: BaseLockBackend, grant: Grant) -> None:
        """Release a grant that never reached the caller, best-effort: its lease ends it otherwise."""
        try:
            backend.release(grant)
        except Exception:  # the error that made us give it back is the one to see
            logger.warning("could not give back a grant of %s", grant.taken[-1:] or "nothing", exc_info=True)

    # The waiting loop, once for both APIs: it yields what to do next (_TRY the
    # backend's acquire, _Sleep, _Wait for a release) and is sent the outcome of
    # each try (a grant, None for a refusal, or the LockStoreBusy raised).

    def release(self) -> None:
        """Give the lock back; raise LockLost if it had been lost meanwhile."""
        grant = self._grant
        if grant is None or self._forget_inherited():
            return
        was_lost, already_signalled = self._letting_go()
        try:
            still_held = self.backend.release(grant)
        finally:
            self._grant = None
        self._released(still_held, was_lost, already_signalled)

    def checkpoint(self, data: Mapping[str, Any]) -> None:
        """Record how far the work under this lock got (and renew the lease)."""
        checkpoint = self._checkpoint_data(data)
        self.check()
        assert self._grant is not None
        started = time.monotonic()
        if not self.backend.renew(self._grant, checkpoint=checkpoint, timeout=self._call_timeout()):
            self._mark_lost("its holder record was gone at checkpoint")
            self.check()
        self._checkpoint = checkpoint
        self._renewed(started)

    def handoff(self, ttl: float | None = None) -> str:
        """Give the lock to whoever claims the returned ticket with :func:`~django_esdlock.resume_lock`.

        The lease is set to ``ttl`` seconds from now (default: the lock's TTL)
        and nobody renews it until the ticket is claimed: that is how long the
        ticket stays valid. This lock stops renewing, and its release (or the
        end of its ``with`` block) no longer gives the lock back. Raise
        LockLost if the lock was already lost.
        """
        timeout = self._call_timeout()
        renewed = self._handoff_start(ttl)
        try:
            ok = self.backend.renew(renewed, timeout=timeout)
        except BaseException:
            self._handoff_failed()
            raise
        return self._handed(renewed, ok)

    @classmethod
    def adopt(cls, grant: Grant, backend: BaseLockBackend, *, started: float) -> Lock:
        """Hold a grant made outside :meth:`acquire` (a reaper's takeover), renewing it."""
        lock = cls(grant.request.targets, ttl=grant.request.ttl, intent=grant.request.intent, backend=backend)
        lock._grant = grant
        lock._pid = os.getpid()
        lock._valid_until = started + backend.held_for(grant.request.ttl)
        _registry.add(lock)
        _renewer.add(lock, grant.request.ttl)
        return lock

    def abandon(self, *, recovery: Mapping[str, Any] | None = None) -> None:
        """Stop renewing and forget the grant without releasing it: its lease will run out.

        With ``recovery``, record it with the holders first (a failed recovery
        stays visible and is retried once the lease is gone).
        """
        grant = self._grant
        if grant is None or self._forget_inherited():
            return
        _renewer.remove(self)
        _registry.remove(self)
        self._grant = None
        if recovery is not None:
            self.backend.renew(grant, recovery=dict(recovery))

    # --- context manager ------------------------------------------------------

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.release()
            return
        try:
            self.release()
        except Exception:
            # The block's own exception is the one to see; the lease ends the lock anyway.
            logger.warning("releasing %r after %s failed", self, exc_type.__name__, exc_info=True)


def read_wait_state(backend: BaseLockBackend, nodes: Sequence[Node] | None) -> Any:
    """Return the store's waiting state for a _Look: None if the store failed, _UNSUPPORTED if it cannot tell."""
    try:
        return backend.wait_state(nodes)
    except NotImplementedError:
        return _UNSUPPORTED
    except LockBackendUnavailable as e:  # detection is best effort: waiting goes on
        logger.info("cannot look for a deadlock now: %s", e)
        return None


async def aread_wait_state(backend: BaseLockBackend, nodes: Sequence[Node] | None) -> Any:
    """Async :func:`read_wait_state`."""
    try:
        return await backend.await_state(nodes)
    except NotImplementedError:
        return _UNSUPPORTED
    except LockBackendUnavailable as e:
        logger.info("cannot look for a deadlock now: %s", e)
        return None


def _holder_context() -> object:
    """Return who is asking in this process: the running asyncio task, else the thread."""
    task = current_task()
    return ("thread", threading.get_ident()) if task is None else task


class _HeldRegistry:
    """Which locks each thread (or asyncio task) of this process holds, to refuse waiting on oneself."""

    def __init__(self) -> None:
        self._lock = ForkSafeLock()
        self._by_holder: dict[object, list[BaseLock]] = {}
        os.register_at_fork(after_in_child=self._by_holder.clear)

    def add(self, lock: BaseLock) -> None:
        with self._lock:
            self._by_holder.setdefault(_holder_context(), []).append(lock)

    def remove(self, lock: BaseLock) -> None:
        with self._lock:
            for holder, held in list(self._by_holder.items()):
                if lock in held:
                    held.remove(lock)
                if not held:
                    del self._by_holder[holder]  # also lets a finished task go

    def of_current_holder(self) -> list[BaseLock]:
        with self._lock:
            return list(self._by_holder.get(_holder_context(), ()))


_registry = _HeldRegistry()


def _check_self_deadlock(lock: BaseLock) -> None:
    """Raise LockDeadlock if this thread (or task) holds one of ``lock``'s nodes in a conflicting mode."""
    wanted = dict(lock.targets)
    for held in _registry.of_current_holder():
        if held.lost:
            continue
        for node, held_mode in held.targets:
            mode = wanted.get(node)
            if mode is None or compatible(held_mode, mode):
                continue
            if lock.reentrant and held.reentrant and held_mode == mode:
                continue  # document locks: taking what this owner holds is a no-op
            raise LockDeadlock(
                f"this {'task' if current_task() else 'thread'} already holds {node} in mode {held_mode} ({held!r}); "
                f"waiting for mode {mode} would wait for itself"
            )


def _held_here(lock: BaseLock) -> frozenset[Node]:
    """Return the nodes of ``lock`` this thread (or task) holds in the same mode by a reentrant lock not lost.

    Only those may the store treat as already held (a no-op). An entry of this
    owner that the store still keeps without such a lock (a release that did
    not reach it, a lock lost) is a holder like any other until its lease
    ends: a no-op there would be a grant with no entry of its own.
    """
    wanted = set(lock.targets)
    return frozenset(
        node
        for held in _registry.of_current_holder()
        if held.reentrant and not held.lost
        for node, _ in wanted.intersection(held.targets)
    )


class _Workers:
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


class _Renewer:
    """Keeps the leases of this process's held locks: one scheduling thread, the store calls in :class:`_Workers`.

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
        self._workers = _Workers()

    def add(self, lock: BaseLock, ttl: float) -> None:
        with self._cond:
            self._held.add(lock)
            self._due[lock] = time.monotonic() + min(ttl / 3, self.FIRST_RENEWAL)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="django-esdlock-renewer", daemon=True)
                self._thread.start()
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
                self._cond.wait(timeout=max(wake - now, 0.001))
                return
            batches: dict[BaseLockBackend, list[BaseLock]] = {}
            for lock in due:
                del self._due[lock]
                batches.setdefault(lock.backend, []).append(lock)
            calls = []
            for backend, locks in batches.items():
                timeout = min(lock._call_timeout() for lock in locks)
                for lock in locks:
                    self._renewing[lock] = now + timeout
                calls.append(functools.partial(self._renew, backend, locks, timeout))
            failures = {lock: self._failures.pop(lock, None) for lock in ended}
        for call in calls:
            self._workers.submit(call)
        for lock, failure in failures.items():
            reason = "no renewal succeeded within its lease" + (f" (the last failed: {failure})" if failure else "")
            _guarded(lock, lock._mark_lost, reason)

    def _renew(self, backend: BaseLockBackend, locks: list[BaseLock], timeout: float) -> None:
        """Renew ``locks`` in one call of at most ``timeout`` seconds; settle each lock's outcome."""
        started = time.monotonic()
        held = [(lock, lock.grant) for lock in locks if lock.grant is not None]  # not let go meanwhile
        outcomes: list[bool | None] = [None] * len(held)
        failure = "the store was busy"
        try:
            outcomes = list(backend.renew_many([grant for _, grant in held], timeout=timeout))
            if len(outcomes) != len(held):
                raise TypeError(f"{type(backend).__name__}.renew_many answered {len(outcomes)} of {len(held)} grants")
        except Exception as e:  # noqa: BLE001 - any failure is retried until the lease is gone
            outcomes, failure = [None] * len(held), f"{type(e).__name__}: {e}"
        for (lock, _), outcome in zip(held, outcomes, strict=True):
            _guarded(lock, self._settle, lock, outcome, started, failure)
        settled = {lock for lock, _ in held}
        for lock in locks:
            if lock not in settled:  # let go meanwhile: no longer in flight
                _guarded(lock, self._settle, lock, None, started, failure)

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


def _guarded(lock: BaseLock, call: Callable[..., None], *args: Any) -> None:
    """Run ``call`` for ``lock``; whatever it raises (a receiver's SystemExit too) is logged, and ends nothing else."""
    try:
        call(*args)
    except BaseException:  # the renewer's threads serve every lock of the process
        logger.exception("the lock renewer could not settle %r", lock)


_renewer = _Renewer()


# --- the three schemes of the chapter, as sets of (node, mode) --------------


def tree_targets(path: str, *, shared: bool, namespace: str, intent: Mapping[str, Any] | None) -> Targets:
    """Return what ``lock_tree`` takes: X on ``path`` (S if ``shared``), IX (IS) on its ancestors."""
    path = normalize_path(path)
    namespace = normalize_namespace(namespace)
    if shared and intent is not None:
        raise InvalidLockArgument("an intent describes a change, so it needs an exclusive lock (shared=False)")
    ancestor_mode, mode = (Mode.IS, Mode.S) if shared else (Mode.IX, Mode.X)
    targets = tuple((Node(namespace, Kind.TREE, a), ancestor_mode) for a in ancestors(path))
    return (*targets, (Node(namespace, Kind.TREE, path), mode))


def global_targets(name: str) -> Targets:
    """Return what ``global_lock`` takes: X on one named lock."""
    return ((Node("default", Kind.GLOBAL, normalize_key(name, "lock name")), Mode.X),)


def document_targets(ids: Iterable[str], *, namespace: str) -> Targets:
    """Return what ``lock_documents`` takes: X on each id, in one order."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise InvalidLockArgument(f"ids must be a list of str, not {type(ids).__name__}: {ids!r}")
    namespace = normalize_namespace(namespace)
    keys = sorted({normalize_key(i) for i in ids})
    if not keys:
        raise InvalidLockArgument("ids must name at least one document")
    return tuple((Node(namespace, Kind.DOCUMENT, key), Mode.X) for key in keys)


def lock_tree(
    path: str,
    *,
    shared: bool = False,
    timeout: float | None = None,
    ttl: float | None = None,
    namespace: str = "default",
    intent: Mapping[str, Any] | None = None,
    backend: BaseLockBackend | None = None,
) -> Lock:
    """Lock ``path`` and the subtree below it: X on it (S if ``shared``), IX (IS) on its ancestors."""
    targets = tree_targets(path, shared=shared, namespace=namespace, intent=intent)
    return Lock(targets, timeout=timeout, ttl=ttl, intent=intent, backend=backend)


def global_lock(
    name: str = "global",
    *,
    timeout: float | None = None,
    ttl: float | None = None,
    backend: BaseLockBackend | None = None,
) -> Lock:
    """Lock one named lock exclusively: the chapter's global lock."""
    return Lock(global_targets(name), timeout=timeout, ttl=ttl, backend=backend)


def lock_documents(
    ids: Iterable[str],
    *,
    namespace: str = "default",
    timeout: float | None = None,
    ttl: float | None = None,
    backend: BaseLockBackend | None = None,
) -> Lock:
    """Lock many document ids at once, all or nothing; ids this thread holds already are kept."""
    targets = document_targets(ids, namespace=namespace)
    return Lock(targets, timeout=timeout, ttl=ttl, reentrant=True, backend=backend)
