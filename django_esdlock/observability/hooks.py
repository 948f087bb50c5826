"""The hooks the lock code calls: each records its event in the metrics, the spans and the log, as far as on."""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Any

from .. import signals
from ..exceptions import LockStoreBusy
from . import logs
from .labels import OPERATIONS, lock_labels, loss_reason, mode_of, outcome_of, store_of
from .state import never_raises, state

# --- acquire -----------------------------------------------------------------


_acquiring: contextvars.ContextVar[AcquireWatch | None] = contextvars.ContextVar("esdlock_acquiring", default=None)


class AcquireWatch:
    """One acquire call: its ``esdlock_acquire_seconds``, its ``esdlock.acquire`` span, its slow-wait line.

    Its lock's labels are found once, here, for the acquire and the hold it may begin (:func:`holding`).
    """

    __slots__ = ("_reset", "_token", "labels", "lock", "outer", "span", "started", "state")

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.state = state()
        self.labels: tuple[str, str, str] | None = None
        self.span: Any = None
        self.outer: Any = None

    def __enter__(self) -> AcquireWatch:
        self.started = time.monotonic()
        self._reset = _acquiring.set(self)
        current = self.state
        if current.metrics is not None or current.tracing is not None:
            self._begin()
        return self

    @never_raises
    def _begin(self) -> None:
        lock = self.lock
        self.labels = labels = lock_labels(lock)
        tracing = self.state.tracing
        if tracing is None:
            return
        self.outer = tracing.current_context()
        store, namespace, kind = labels
        self.span = tracing.begin(
            "esdlock.acquire",
            {
                "esdlock.store": store,
                "esdlock.namespace": namespace,
                "esdlock.kind": kind,
                "esdlock.targets": logs.target_names(lock),
                "esdlock.mode": mode_of(lock),
                "esdlock.timeout": -1.0 if lock.timeout is None else lock.timeout,
            },
            self.outer,
        )
        self._token = tracing.make_current(self.span)

    def __exit__(self, exc_type: Any, error: BaseException | None, tb: Any) -> None:
        _acquiring.reset(self._reset)
        current = self.state
        waited = time.monotonic() - self.started
        if self.labels is not None or (error is None and current.slow_wait is not None and waited > current.slow_wait):
            self._report(waited, error)

    @never_raises
    def _report(self, waited: float, error: BaseException | None) -> None:
        outcome = outcome_of(error)
        lock, current = self.lock, self.state
        if current.metrics is not None and self.labels is not None:
            current.metrics.acquired(self.labels, outcome, waited)
        if error is None and current.slow_wait is not None and waited > current.slow_wait:
            logs.slow_grant(lock, waited, current.slow_wait)
        span = self.span
        if span is not None:
            tracing = current.tracing
            tracing.restore(self._token)
            if span.is_recording():
                # One by one: the SDK checks a dict of attributes against the Mapping and Sequence ABCs first.
                span.set_attribute("esdlock.outcome", outcome)
                span.set_attribute("esdlock.waited_seconds", waited)
                token = lock.token
                if token is not None:
                    span.set_attribute("esdlock.token", token)
            tracing.end(span, error if outcome == "error" else None)


def acquiring(lock: Any) -> AcquireWatch:
    """Watch one acquire call: ``with observability.acquiring(lock): ...``."""
    return AcquireWatch(lock)


@never_raises
def waiting(attempt: int, seconds: float) -> None:
    """A wait round of an acquire begins: an event of its span."""
    tracing = state().tracing
    if tracing is not None:
        tracing.event(None, "esdlock.wait", {"esdlock.attempt": attempt, "esdlock.seconds": seconds})


@never_raises
def looking_for_deadlock(nodes: Any) -> None:
    """A waiting acquire reads the store's waiting state: an event of its span."""
    tracing = state().tracing
    if tracing is not None:
        tracing.event(None, "esdlock.deadlock_look", {"esdlock.confirming": nodes is not None})


@never_raises
def deadlock_victim(lock: Any, described: str, cycle: Any) -> None:
    """``lock``'s request gives up to break ``cycle``: a count and a line (its span ends as ``deadlock``)."""
    watch = _acquiring.get()
    waited = None if watch is None else time.monotonic() - watch.started
    logs.deadlock_victim(lock, described, cycle.describe(), waited)
    current = state()
    if current.metrics is not None:
        store, namespace, _ = lock_labels(lock)
        current.metrics.count(current.metrics.deadlock_victims, store, namespace)
    if current.tracing is not None:
        current.tracing.event(None, "esdlock.deadlock_victim", {"esdlock.cycle": cycle.describe()[:1000]})


# --- holding -------------------------------------------------------------------


class Hold:
    """What the hooks keep of a held lock, from its grant to its end."""

    __slots__ = ("labels", "span", "started")

    def __init__(self, started: float, labels: tuple[str, str, str], span: Any) -> None:
        self.started = started
        self.labels = labels
        self.span = span


@never_raises
def holding(lock: Any) -> None:
    """``lock`` was granted: count it held, start its ``esdlock.hold`` span (a sibling of its acquire's)."""
    lock.__dict__.pop("_observed_loss", None)  # a lock object taken again may be lost again
    current = state()
    metrics, tracing = current.metrics, current.tracing
    if metrics is None and tracing is None:
        return
    watch = _acquiring.get()
    if watch is not None and watch.lock is not lock:
        watch = None  # a lock held without an acquire (a reaper's takeover, a resumed ticket)
    labels = watch.labels if watch is not None and watch.labels is not None else lock_labels(lock)
    span = None
    # A hold whose acquire was sampled out is not traced either: one decision per lock pair, not two (the hold
    # is a second root when the caller has no span, and the sampler would draw for it again).
    sampled_out = watch is not None and watch.span is not None and not watch.span.is_recording()
    if tracing is not None and not sampled_out:
        grant = lock.grant
        # What finds the hold beside its acquire (same parent); the rest is on the acquire span.
        span = tracing.begin(
            "esdlock.hold",
            {
                "esdlock.namespace": labels[1],
                "esdlock.token": grant.token if grant is not None else -1,
                "esdlock.holder_id": grant.request.holder_id if grant is not None else "",
            },
            None if watch is None else watch.outer,
        )
    if metrics is not None:
        metrics.hold_began(labels)
    lock.__dict__["_observed_hold"] = Hold(time.monotonic(), labels, span)


def _end_hold(lock: Any, outcome: str, event: str | None, attributes: dict[str, Any]) -> None:
    """End ``lock``'s hold with ``outcome``; ``event`` on its span first (None: the outcome says it all)."""
    hold = lock.__dict__.pop("_observed_hold", None)  # atomic: a loss and a release may race
    if hold is None:
        return
    current = state()
    if current.metrics is not None:
        current.metrics.hold_ended(hold.labels, outcome, time.monotonic() - hold.started)
    span = hold.span
    if span is not None and current.tracing is not None:
        if span.is_recording():
            if event is not None:
                span.add_event(event, attributes)
            span.set_attribute("esdlock.outcome", outcome)
        span.end()


@never_raises
def checkpointed(lock: Any) -> None:
    """``lock`` recorded a checkpoint: an event of its hold span."""
    hold = lock.__dict__.get("_observed_hold")
    current = state()
    if hold is not None and hold.span is not None and current.tracing is not None:
        current.tracing.event(hold.span, "checkpoint", {})


@never_raises
def lost(lock: Any, reason: str) -> None:
    """``lock`` was lost: one line, one count, the end of its hold; once, however many times it is told.

    (The renewer may find the lease over while a release of the lock is on
    its way to the store: both then say so.)
    """
    told = object()
    if lock.__dict__.setdefault("_observed_loss", told) is not told:  # atomic: the first to tell wins
        return
    logs.lost(lock, reason)
    current = state()
    if current.metrics is not None:
        store, namespace, _ = lock_labels(lock)
        current.metrics.lock_lost(store, namespace, loss_reason(reason))
    _end_hold(lock, "lost", "lost", {"esdlock.reason": reason})


@never_raises
def released(lock: Any, lost_reason: str | None) -> None:
    """``lock`` was released; ``lost_reason`` if the release found it lost and nobody had said so yet."""
    if lost_reason is not None:
        lost(lock, lost_reason)
    else:
        _end_hold(lock, "released", None, {})


@never_raises
def handed_off(lock: Any) -> None:
    """``lock`` was handed off: its hold here ends (the claimant's begins in its own process)."""
    _end_hold(lock, "handed_off", "handoff", {})


# --- the renewer and the stores -------------------------------------------------


@never_raises
def renewal(backend: Any, outcome: str, lag: float | None) -> None:
    """One held lock's renewal ended with ``outcome`` (``ok``, ``busy``, ``error``, ``lost``), ``lag`` s late."""
    metrics = state().metrics
    if metrics is not None:
        metrics.renewal(store_of(backend), outcome, None if lag is None else max(0.0, lag))


class RequestWatch:
    """One store round trip: its ``esdlock_store_request_seconds``."""

    __slots__ = ("action", "backend", "metrics", "started")

    def __init__(self, metrics: Any, backend: Any, action: str) -> None:
        self.metrics = metrics
        self.backend = backend
        self.action = action

    def __enter__(self) -> None:
        self.started = time.monotonic()

    @never_raises
    def __exit__(self, exc_type: Any, error: BaseException | None, tb: Any) -> None:
        outcome = "ok" if error is None else "busy" if isinstance(error, LockStoreBusy) else "error"
        self.metrics.store_request(
            store_of(self.backend), OPERATIONS.get(self.action, "setup"), outcome, time.monotonic() - self.started
        )


_NOTHING = contextlib.nullcontext()


def store_request(backend: Any, action: str) -> contextlib.AbstractContextManager[None]:
    """Watch one round trip to the store: ``with observability.store_request(self, "acquire"): ...``."""
    metrics = state().metrics
    return _NOTHING if metrics is None else RequestWatch(metrics, backend, action)


class ReapWatch:
    """One reaper pass: its ``esdlock.reap`` span, with what it did."""

    def __init__(self, backend: Any, namespace: str | None, dry_run: bool) -> None:
        self.tracing = state().tracing
        self.attributes = {"esdlock.store": store_of(backend), "esdlock.dry_run": dry_run}
        if namespace is not None:
            self.attributes["esdlock.namespace"] = namespace
        self.span: Any = None

    def __enter__(self) -> ReapWatch:
        if self.tracing is not None:
            self._begin_span()
        return self

    @never_raises
    def _begin_span(self) -> None:
        self.span = self.tracing.begin("esdlock.reap", self.attributes)
        self._token = self.tracing.make_current(self.span)

    def done(self, report: Any) -> Any:
        """Record what the pass did (a ``ReapReport``); return it."""
        if self.span is not None and self.span.is_recording():
            counts = report.as_dict()["counts"]
            self.span.set_attributes({f"esdlock.{name}": count for name, count in counts.items()})
        return report

    @never_raises
    def __exit__(self, exc_type: Any, error: BaseException | None, tb: Any) -> None:
        if self.span is not None:
            self.tracing.restore(self._token)
            self.tracing.end(self.span, error)


def reaping(backend: Any, namespace: str | None, dry_run: bool) -> ReapWatch:
    """Watch one reaper pass: ``with observability.reaping(...) as reap: return reap.done(report)``."""
    return ReapWatch(backend, namespace, dry_run)


@never_raises
def _reaped(sender: Any, holder: Any, **kwargs: Any) -> None:
    metrics = state().metrics
    if metrics is not None:
        metrics.count(metrics.reaped, holder.node.namespace)


@never_raises
def _recovered(sender: Any, holder: Any, **kwargs: Any) -> None:
    metrics = state().metrics
    if metrics is not None:
        metrics.count(metrics.recovered, holder.node.namespace)


signals.lock_reaped.connect(_reaped, weak=False, dispatch_uid="django_esdlock.observability")
signals.lock_recovered.connect(_recovered, weak=False, dispatch_uid="django_esdlock.observability")
