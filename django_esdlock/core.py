"""What every lock shares, blocking or async: the request, the waiting loop as steps, the held registry.

:class:`BaseLock` builds the request and waits for it as steps (see
``steps.py``): ``locks.Lock`` drives them with blocking calls,
``aio.AsyncLock`` awaits them. The registry knows which locks each thread
or task of this process holds (to refuse waiting on oneself and to re-enter
document locks); the renewer (``renewal.py``) keeps their leases.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import observability, signals
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
from .records import Grant, Kind, LockRequest, Node, Owner, Targets, WaitState, current_task
from .renewal import renewer
from .steps import TRY, LookForDeadlock, Sleep, Steps, WaitForRelease
from .tickets import Ticket, names

logger = logging.getLogger("django_esdlock")


def validate_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        raise InvalidLockArgument(f"timeout must be None, 0 or a positive number of seconds, not {timeout!r}")
    return float(timeout)


def validate_ttl(ttl: Any) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
        raise InvalidLockArgument(f"ttl must be None or a positive number of seconds, not {ttl!r}")
    return float(ttl)


def validate_json(value: Any, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidLockArgument(f"{what} must be a dict, not {type(value).__name__}")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidLockArgument(f"{what} must be JSON-serializable: {e}") from e


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
        holder_limit: int | None = None,
        backend: BaseLockBackend | None = None,
    ) -> None:
        self.targets = targets
        self.holder_limit = holder_limit
        """A semaphore's limit as asked (see :attr:`limit` for the one that stands); None for a lock."""
        self.timeout = validate_timeout(timeout)
        self.ttl = validate_ttl(ttl)
        self.intent = validate_json(intent, "intent")
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
    def limit(self) -> int | None:
        """A semaphore's limit: the one that stood when it was granted, else the one asked; None for a lock."""
        if self._grant is not None and self._grant.holder_limit is not None:
            return self._grant.holder_limit
        return self.holder_limit

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
        check_self_deadlock(self)
        reentered = held_here(self) if self.reentrant else frozenset()
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
            holds_others=bool(registry.of_current_holder()),
            holder_limit=self.holder_limit,
        )
        return backend, request

    def _attempts(self, backend: BaseLockBackend, request: LockRequest) -> Steps[tuple[Grant, float]]:
        """Try, wait and try again until granted or the timeout; return the grant and when its try began.

        The waiting loop, once for both APIs: it yields :data:`~django_esdlock.steps.TRY`
        (the backend's acquire), :class:`~django_esdlock.steps.Sleep`,
        :class:`~django_esdlock.steps.WaitForRelease` and
        :class:`~django_esdlock.steps.LookForDeadlock`; a try is answered with
        the grant or None (refused), or thrown the LockStoreBusy it raised.
        """
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        attempt = busy_attempt = 0
        # An owner that holds nothing is never a deadlock's victim (see deadlock.Cycle.victim): no look.
        looks = request.holds_others and backend.features.can_list_waiting
        deadlock_timeout = backend.deadlock_timeout if looks else None
        next_look: float | None = None
        while True:
            started = time.monotonic()
            try:
                grant = yield TRY
            except LockStoreBusy:
                # Turned away for now (429, 503): nothing was granted; try again within the deadline.
                remaining = math.inf if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    raise
                yield Sleep(min(remaining, backoff_delay(busy_attempt, cap=1.0)))
                busy_attempt += 1
                continue
            if grant is not None:
                return grant, started
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if self.timeout == 0:
                reason = backend.refusal_reason(request) or self._refused_because()
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
                    yield from self._look_for_deadlock(request)
                    next_look = time.monotonic() + deadlock_timeout
                pause = min(pause, max(0.0, next_look - time.monotonic()))
            # A queued request polls often: everyone behind it waits for its turn.
            observability.waiting(attempt, pause)
            yield WaitForRelease(pause, attempt)
            attempt += 1

    def _look_for_deadlock(self, request: LockRequest) -> Steps[None]:
        """Raise LockDeadlock if ``request`` is the victim of a confirmed cycle.

        A look is answered with the store's waiting state, or None when the
        store failed to give it this time (detection is best effort: waiting
        goes on, and looks again later).
        """
        observability.looking_for_deadlock(None)
        state = yield LookForDeadlock()
        if state is None:
            return
        cycle = find_cycle(state, request.holder_id)
        if cycle is None or cycle.victim.holder_id != request.holder_id:
            return  # no cycle, or another member gives up
        observability.looking_for_deadlock(cycle.nodes)
        again = yield LookForDeadlock(cycle.nodes)
        if again is None or not confirmed(cycle, again):
            return
        observability.deadlock_victim(self, self._describe(), cycle)
        raise LockDeadlock(f"{self._describe()} is the youngest request of a deadlock: {cycle.describe()}", cycle=cycle)

    def _hold(self, grant: Grant, started: float) -> None:
        """Become the holder of ``grant``: renewed from now on, known to deadlock detection.

        If anything fails here, nothing of it stays registered; the caller
        gives the grant back to the store.
        """
        self._grant = grant
        self._pid = os.getpid()
        self._lost_reason = None
        self.__dict__.pop("_lost_signalled", None)
        self._valid_until = started + self.backend.held_for(grant.request.ttl)
        if grant.holder_limit not in (None, self.holder_limit):
            logger.warning(
                "%s: asked with limit %s, granted under limit %s: its holders' limit stands while any holds",
                self._describe(),
                self.holder_limit,
                grant.holder_limit,
            )
        try:
            registry.add(self)
            renewer.add(self, grant.request.ttl)
            logger.debug("acquired %r", self)
            signals.send(signals.lock_acquired, sender=type(self), lock=self)
            observability.holding(self)
        except BaseException:
            renewer.remove(self)
            registry.remove(self)
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

    def _letting_go(self) -> bool:
        """Stop renewing before a release; return whether the lock was lost.

        A renewal in flight is not waited for: its outcome is ignored from now on.
        """
        renewer.remove(self)
        registry.remove(self)
        return self.lost

    def _released(self, still_held: bool, was_lost: bool) -> None:
        """Signal the release; raise LockLost if the lock had been lost before it.

        A loss the renewer found is reported again here: the report counts once, and a renewer that set the
        reason but has not reported it yet must not let this hold be counted as released.
        """
        if not still_held and self._lost_reason is None:
            self._lost_reason = "its holder record was gone at release"
        if self._lost_reason is None and was_lost:
            self._lost_reason = "its lease ran out before a renewal"
        logger.debug("released %r", self)
        observability.released(self, self._lost_reason)
        signals.send(signals.lock_released, sender=type(self), lock=self)
        if self._lost_reason is not None:
            self._signal_lost(self._lost_reason)  # unless the renewer sent it when it noticed
            raise LockLost(f"{self!r} was lost before release: {self._lost_reason}")

    # --- hand-off (see handoff.py): the twins' handoff() call these around one renewal

    def _handoff_start(self, ttl: float | None, *, settle: bool = True) -> Grant:
        """Stop renewing for a hand-off; return the grant as the renewal that sets the ticket's lease sends it.

        ``settle=False``: the caller has let a renewal in flight end already.
        """
        ttl = validate_ttl(ttl)
        if not self.backend.features.can_take_over:
            raise NotImplementedError(f"{self.backend.describe()} cannot hand a lock off: it cannot take a holder over")
        self.check()
        grant = self._grant
        assert grant is not None
        # Settled: a renewal in flight must not land after ours (it would cut the
        # ticket's lease short) nor after the claim (it would report the lock lost).
        renewer.remove(self, settle=settle)
        registry.remove(self)
        if ttl is None:
            return grant
        return dataclasses.replace(grant, request=dataclasses.replace(grant.request, ttl=ttl))

    def _handoff_failed(self) -> None:
        """The renewal of a hand-off raised: the lock is still ours, renewed as before."""
        assert self._grant is not None
        registry.add(self)
        renewer.add(self, self._grant.request.ttl)

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
        observability.handed_off(self)
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
            observability.lost(self, reason)
            self._signal_lost(reason)

    def _signal_lost(self, reason: str) -> None:
        """Send ``lock_lost`` for this hold once: a renewal that finds the lease over while a release is on its
        way to the store (it is not waited for) and that release both find the lock lost."""
        told = object()
        if self.__dict__.setdefault("_lost_signalled", told) is told:  # atomic: the first to tell sends it
            signals.send(signals.lock_lost, sender=type(self), lock=self, reason=reason)

    def _checkpoint_data(self, data: Mapping[str, Any]) -> dict[str, Any] | None:
        """Return ``data`` as the checkpoint to record, or raise InvalidLockArgument (nothing sent)."""
        checkpoint = validate_json(data, "checkpoint")
        self.backend.limits.check_checkpoint(checkpoint)
        return checkpoint

    def _refused_because(self) -> str:
        if self.holder_limit is None:
            return "is held in a conflicting mode"
        return "has every slot taken, or promised to requests queued before this one"

    def _describe(self) -> str:
        node, mode = self.targets[-1]
        more = f" (+{len(self.targets) - 1} more)" if len(self.targets) > 1 else ""
        return f"{node} in mode {mode}{more}"


def read_wait_state(backend: BaseLockBackend, nodes: Sequence[Node] | None) -> WaitState | None:
    """Perform a :class:`~django_esdlock.steps.LookForDeadlock`: the store's waiting state, or None if it failed."""
    try:
        return backend.wait_state(nodes)
    except LockBackendUnavailable as e:  # detection is best effort: waiting goes on
        logger.info("cannot look for a deadlock now: %s", e)
        return None


async def aread_wait_state(backend: BaseLockBackend, nodes: Sequence[Node] | None) -> WaitState | None:
    """Async :func:`read_wait_state`."""
    try:
        return await backend.await_state(nodes)
    except LockBackendUnavailable as e:
        logger.info("cannot look for a deadlock now: %s", e)
        return None


def holder_context() -> object:
    """Return who is asking in this process: the running asyncio task, else the thread."""
    task = current_task()
    return ("thread", threading.get_ident()) if task is None else task


class HeldRegistry:
    """Which locks each thread (or asyncio task) of this process holds, to refuse waiting on oneself."""

    def __init__(self) -> None:
        self._lock = ForkSafeLock()
        self._by_holder: dict[object, list[BaseLock]] = {}
        os.register_at_fork(after_in_child=self._by_holder.clear)

    def add(self, lock: BaseLock) -> None:
        with self._lock:
            self._by_holder.setdefault(holder_context(), []).append(lock)

    def remove(self, lock: BaseLock) -> None:
        with self._lock:
            for holder, held in list(self._by_holder.items()):
                if lock in held:
                    held.remove(lock)
                if not held:
                    del self._by_holder[holder]  # also lets a finished task go

    def of_current_holder(self) -> list[BaseLock]:
        with self._lock:
            return list(self._by_holder.get(holder_context(), ()))


registry = HeldRegistry()


def check_self_deadlock(lock: BaseLock) -> None:
    """Raise LockDeadlock if this thread (or task) holds one of ``lock``'s nodes in a conflicting mode."""
    wanted = dict(lock.targets)
    held_slots = 0
    for held in registry.of_current_holder():
        if held.lost:
            continue
        if lock.holder_limit is not None and held.targets == lock.targets:
            held_slots += 1
            if held_slots >= (held.limit or lock.holder_limit):
                raise LockDeadlock(
                    f"this {'task' if current_task() else 'thread'} holds {held_slots} of the {held.limit} "
                    f"slots of {lock.targets[0][0]}: waiting for another would wait for itself"
                )
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


def held_here(lock: BaseLock) -> frozenset[Node]:
    """Return the nodes of ``lock`` this thread (or task) holds in the same mode by a reentrant lock not lost.

    Only those may the store treat as already held (a no-op). An entry of this
    owner that the store still keeps without such a lock (a release that did
    not reach it, a lock lost) is a holder like any other until its lease
    ends: a no-op there would be a grant with no entry of its own.
    """
    wanted = set(lock.targets)
    return frozenset(
        node
        for held in registry.of_current_holder()
        if held.reentrant and not held.lost
        for node, _ in wanted.intersection(held.targets)
    )


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


def validate_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidLockArgument(f"a semaphore's limit must be an int of at least 1, not {limit!r}")
    return limit


def semaphore_targets(name: str, *, namespace: str) -> Targets:
    """Return what ``semaphore`` takes: S on one named node, which counts its holders against a limit."""
    namespace = normalize_namespace(namespace)
    return ((Node(namespace, Kind.SEMAPHORE, normalize_key(name, "semaphore name")), Mode.S),)


def document_targets(ids: Iterable[str], *, namespace: str) -> Targets:
    """Return what ``lock_documents`` takes: X on each id, in one order."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise InvalidLockArgument(f"ids must be a list of str, not {type(ids).__name__}: {ids!r}")
    namespace = normalize_namespace(namespace)
    keys = sorted({normalize_key(i) for i in ids})
    if not keys:
        raise InvalidLockArgument("ids must name at least one document")
    return tuple((Node(namespace, Kind.DOCUMENT, key), Mode.X) for key in keys)
