"""The Prometheus metrics of the locks: made once per registry, safe across ``fork``.

Only :mod:`django_esdlock.observability` imports this module, and only when
``prometheus_client`` is installed and ``ESDLOCK_METRICS`` is not False.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ..forks import ForkSafeLock

WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""From a grant that costs one round trip on a local store (~1 ms) to a wait of minutes."""

HELD_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)
"""Locks are held for a request's while or a batch job's hours."""

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""A healthy renewer runs within milliseconds of its schedule; seconds mean it is starved."""

REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class LockMetrics:
    """Every metric of the package on one registry; each method records one event.

    Each records under :data:`guard`, which a ``fork`` waits for: the client's
    own locks are plain ``threading.Lock`` objects, and one held by the
    renewer thread at the fork would stay held in the child forever.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        made = {"registry": registry}
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self.acquire_seconds = Histogram(
            "esdlock_acquire_seconds",
            "Seconds from an acquire call to its end.",
            ["store", "namespace", "kind", "outcome"],
            buckets=WAIT_BUCKETS,
            **made,
        )
        self.held_seconds = Histogram(
            "esdlock_held_seconds",
            "Seconds from a grant to its release, loss or hand-off.",
            ["store", "namespace", "kind", "outcome"],
            buckets=HELD_BUCKETS,
            **made,
        )
        # livesum: under prometheus_client's multiprocess mode, the locks every live worker holds.
        self.held = Gauge(
            "esdlock_held",
            "Locks this process holds now.",
            ["store", "namespace"],
            multiprocess_mode="livesum",
            **made,
        )
        self.renewals = Counter(
            "esdlock_renewals", "Lease renewals of held locks, by outcome.", ["store", "outcome"], **made
        )
        self.renewal_lag_seconds = Histogram(
            "esdlock_renewal_lag_seconds",
            "Seconds a renewal ran after it was due: the early warning of a starved renewer.",
            ["store"],
            buckets=LAG_BUCKETS,
            **made,
        )
        self.lost = Counter(
            "esdlock_lost", "Held locks lost (their lease could not be kept).", ["store", "namespace", "reason"], **made
        )
        self.store_request_seconds = Histogram(
            "esdlock_store_request_seconds",
            "Seconds of each round trip to the lock store.",
            ["store", "operation", "outcome"],
            buckets=REQUEST_BUCKETS,
            **made,
        )
        self.reaped = Counter("esdlock_reaped", "Expired holder records removed by the reaper.", ["namespace"], **made)
        self.recovered = Counter(
            "esdlock_recovered", "Dead holders' intents finished by a recovery handler.", ["namespace"], **made
        )
        self.deadlock_victims = Counter(
            "esdlock_deadlock_victims",
            "Waiting requests that gave up to break a deadlock cycle.",
            ["store", "namespace"],
            **made,
        )
        _made.add(self)

    def _series(self, metric: Any, *labels: str) -> Any:
        """The child of ``metric`` for ``labels``, kept: ``labels()`` validates and locks at each call."""
        key = (metric, labels)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = metric.labels(*labels)
        return series

    def _lock_series(self, metric: Any, labels: tuple[str, ...], outcome: str) -> Any:
        """The child of ``metric`` for a lock's ``labels`` and ``outcome``, kept under a key made of both.

        The hot path of a lock pair: no tuple of labels is built, no varargs.
        """
        key = (metric, labels, outcome)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = metric.labels(*labels, outcome)
        return series

    def acquired(self, labels: tuple[str, str, str], outcome: str, seconds: float) -> None:
        with guard:
            self._lock_series(self.acquire_seconds, labels, outcome).observe(seconds)

    def _held_series(self, labels: tuple[str, str, str]) -> Any:
        """The ``esdlock_held`` child of a lock's labels (its ``store`` and ``namespace``)."""
        key = (self.held, labels)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = self.held.labels(labels[0], labels[1])
        return series

    def hold_began(self, labels: tuple[str, str, str]) -> None:
        with guard:
            self._held_series(labels).inc()

    def hold_ended(self, labels: tuple[str, str, str], outcome: str, seconds: float) -> None:
        with guard:
            self._held_series(labels).dec()
            self._lock_series(self.held_seconds, labels, outcome).observe(seconds)

    def lock_lost(self, store: str, namespace: str, reason: str) -> None:
        with guard:
            self._series(self.lost, store, namespace, reason).inc()

    def renewal(self, store: str, outcome: str, lag: float | None) -> None:
        with guard:
            self._series(self.renewals, store, outcome).inc()
            if lag is not None:
                self._series(self.renewal_lag_seconds, store).observe(lag)

    def store_request(self, store: str, operation: str, outcome: str, seconds: float) -> None:
        with guard:
            self._series(self.store_request_seconds, store, operation, outcome).observe(seconds)

    def count(self, counter: Any, *labels: str) -> None:
        with guard:
            self._series(counter, *labels).inc()

    def _forget_held(self) -> None:
        """In a forked child: it holds none of its parent's locks (the other series count what happened)."""
        self.held.clear()
        self._children = {key: series for key, series in self._children.items() if key[0] is not self.held}


guard = threading.Lock()
"""Held while a metric is written; a fork waits for it, so no client lock is copied held."""

_made: weakref.WeakSet[LockMetrics] = weakref.WeakSet()
_by_registry: dict[CollectorRegistry, LockMetrics] = {}
_making = ForkSafeLock()


def metrics_on(registry: CollectorRegistry | None = None) -> LockMetrics:
    """Return the metrics registered on ``registry`` (default: prometheus_client's), registering them once."""
    registry = REGISTRY if registry is None else registry
    with _making:
        found = _by_registry.get(registry)
        if found is None:
            found = _by_registry[registry] = LockMetrics(registry)
        return found


def _after_fork_in_child() -> None:
    guard.release()
    for metrics in list(_made):
        metrics._forget_held()


os.register_at_fork(before=guard.acquire, after_in_parent=guard.release, after_in_child=_after_fork_in_child)
