"""The dashboard's panels, filled by a workload on one store: ``lock_bench --dashboard PNG``.

The workload runs in this process with the metrics on a registry of its own,
read every half second as a Prometheus server would scrape it. The panels
are those of ``docs/_static/esdlock-dashboard.json`` (Grafana), computed
the way its queries compute them (``rate`` and ``histogram_quantile`` over
a 5 s window) and drawn with matplotlib.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .. import observability
from ..exceptions import LockLost, LockTimeout
from ..locks import lock_tree
from .kit import StoreKit

Say = Callable[[str], None]
Sample = tuple[str, tuple[tuple[str, str], ...]]
"""A series: its sample name and its labels, sorted."""

SCRAPE_EVERY = 0.5
WINDOW = 5.0
"""Seconds of the ``rate()`` window of the panels."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """Who takes locks in which namespace: worker threads on a few hot keys, each with its timeout."""

    namespace: str
    workers: int
    keys: int
    hold: float
    """Mean seconds a worker holds a lock (exponential)."""
    timeout: float


WORKLOADS = (
    Workload("orders", workers=4, keys=6, hold=0.01, timeout=2.0),
    Workload("fs", workers=3, keys=2, hold=0.03, timeout=1.0),
    Workload("reports", workers=3, keys=1, hold=0.08, timeout=0.1),
)


@dataclasses.dataclass
class Recording:
    """What the scrapes read: for each scrape, its time and every sample."""

    store: str
    seconds: float
    scrapes: list[tuple[float, dict[Sample, float]]] = dataclasses.field(default_factory=list)


def _scrape(registry: Any) -> dict[Sample, float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in registry.collect()
        for sample in metric.samples
    }


def _work(kit: StoreKit, load: Workload, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        key = f"/{load.namespace}/k{rng.randrange(load.keys)}"
        try:
            with lock_tree(key, namespace=load.namespace, timeout=load.timeout, backend=kit.backend):
                time.sleep(rng.expovariate(1 / load.hold))
        except LockTimeout:
            pass


def record(kit: StoreKit, seconds: float, say: Say) -> Recording:
    """Run the workload for ``seconds`` with the metrics on a registry of its own; return the scrapes.

    Besides the workers: one long holder per namespace (renewed every half
    second), and a third of the way in, one of them force-released in the
    store, as an operator would: its renewer finds it gone, a loss.
    """
    from prometheus_client import CollectorRegistry

    from ..observability.metrics import metrics_on

    registry = CollectorRegistry()
    observability.use(observability.State(metrics_on(registry), None, None))
    recording = Recording(kit.name, seconds)
    stop = threading.Event()
    threads = [
        threading.Thread(target=_work, args=(kit, load, stop, i * 100 + n), daemon=True)
        for i, load in enumerate(WORKLOADS)
        for n in range(load.workers)
    ]
    long_held = [
        lock_tree(f"/{load.namespace}/batch", namespace=load.namespace, ttl=1.5, backend=kit.backend).acquire()
        for load in WORKLOADS
    ]
    say(f"{kit.name}: dashboard workload for {seconds:g} s ({len(threads)} threads)")
    started = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        released = False
        while (now := time.monotonic() - started) < seconds:
            recording.scrapes.append((now, _scrape(registry)))
            if not released and now > seconds / 3:
                victim = long_held[1]
                assert victim.grant is not None
                kit.backend.force_release(victim.holder_id or "", [node for node, _ in victim.targets])
                released = True
            time.sleep(SCRAPE_EVERY)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        for lock in long_held:
            with contextlib.suppress(LockLost):  # the one force-released
                lock.release()
        recording.scrapes.append((time.monotonic() - started, _scrape(registry)))
        observability.use(None)
    return recording


# --- what the panels' queries compute -------------------------------------------------------


def _increase(recording: Recording, at: int, keep: Callable[[Sample], bool]) -> tuple[dict[Sample, float], float]:
    """``increase(x[5s])`` at scrape ``at`` of each series ``keep`` selects, and the seconds it spans.

    A series that did not exist yet counts from 0; at the start of the run the window is what has passed.
    """
    now, latest = recording.scrapes[at]
    start = at
    while start > 0 and now - recording.scrapes[start - 1][0] <= WINDOW:
        start -= 1
    earlier, since = (recording.scrapes[start - 1][1], recording.scrapes[start - 1][0]) if start > 0 else ({}, 0.0)
    increases = {key: value - earlier.get(key, 0.0) for key, value in latest.items() if keep(key)}
    return increases, max(now - since, SCRAPE_EVERY)


def _label(key: Sample, name: str) -> str:
    return dict(key[1]).get(name, "")


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """``histogram_quantile``: ``buckets`` are (upper bound, cumulative count), the last ``+Inf``."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return math.nan
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = bound, count
    return lower


def quantiles_by(
    recording: Recording, metric: str, by: str, qs: tuple[float, ...]
) -> dict[tuple[str, float], list[float]]:
    """``histogram_quantile(q, sum by (by, le) (rate(metric_bucket[5s])))`` at each scrape."""
    series: dict[tuple[str, float], list[float]] = {}
    for at in range(len(recording.scrapes)):
        grouped: dict[str, dict[float, float]] = {}
        for key, value in _increase(recording, at, lambda k: k[0] == f"{metric}_bucket")[0].items():
            bound = float(_label(key, "le"))
            group = grouped.setdefault(_label(key, by), {})
            group[bound] = group.get(bound, 0.0) + value
        for group, buckets in grouped.items():
            for q in qs:
                series.setdefault((group, q), [math.nan] * len(recording.scrapes))[at] = quantile(q, buckets.items())
    return series


def rates_by(recording: Recording, metric: str, by: str, **where: str) -> dict[str, list[float]]:
    """``sum by (by) (rate(metric{where}[5s]))`` at each scrape."""
    series: dict[str, list[float]] = {}

    def keep(key: Sample) -> bool:
        return key[0] == metric and all(_label(key, k) == v for k, v in where.items())

    for at in range(len(recording.scrapes)):
        increases, seconds = _increase(recording, at, keep)
        for key, value in increases.items():
            series.setdefault(_label(key, by), [0.0] * len(recording.scrapes))[at] += value / seconds
    return series


def values_by(recording: Recording, metric: str, by: str) -> dict[str, list[float]]:
    """``sum by (by) (metric)`` at each scrape (a gauge)."""
    series: dict[str, list[float]] = {}
    for at, (_, samples) in enumerate(recording.scrapes):
        for key, value in samples.items():
            if key[0] == metric:
                series.setdefault(_label(key, by), [0.0] * len(recording.scrapes))[at] += value
    return series


def draw(recording: Recording, path: str) -> None:
    """Draw the dashboard's six panels from ``recording`` into the PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [t for t, _ in recording.scrapes]
    plt.style.use("dark_background")
    fig, axes = plt.subplots(2, 3, figsize=(18, 9), layout="constrained")
    fig.suptitle(
        f"django-esdlock dashboard panels, filled by lock_bench --dashboard on {recording.store} "
        f"({recording.seconds:g} s; drawn with matplotlib from the run's own scrapes, not Grafana)",
        fontsize=12,
    )
    styles = {0.5: ":", 0.95: "--", 0.99: "-"}

    ax = axes[0][0]
    for (namespace, q), values in sorted(
        quantiles_by(recording, "esdlock_acquire_seconds", "namespace", (0.5, 0.95, 0.99)).items()
    ):
        ax.plot(times, [v * 1000 for v in values], styles[q], label=f"{namespace} p{round(q * 100)}")
    _finish(ax, "Wait for a lock (acquire), p50 / p95 / p99", "ms", log=True)

    ax = axes[0][1]
    for namespace, values in sorted(
        rates_by(recording, "esdlock_acquire_seconds_count", "namespace", outcome="granted").items()
    ):
        ax.plot(times, values, label=f"{namespace} granted")
    for namespace, values in sorted(
        rates_by(recording, "esdlock_acquire_seconds_count", "namespace", outcome="timeout").items()
    ):
        ax.plot(times, values, "--", label=f"{namespace} timeout")
    _finish(ax, "Grants and timeouts", "per second")

    ax = axes[0][2]
    for namespace, values in sorted(values_by(recording, "esdlock_held", "namespace").items()):
        ax.plot(times, values, label=namespace)
    _finish(ax, "Locks held (esdlock_held)", "locks")

    ax = axes[1][0]
    for (store, q), values in sorted(
        quantiles_by(recording, "esdlock_renewal_lag_seconds", "store", (0.5, 0.99)).items()
    ):
        ax.plot(times, [v * 1000 for v in values], styles[q], label=f"{store} p{round(q * 100)}")
    _finish(ax, "Renewal lag (late against schedule)", "ms")

    ax = axes[1][1]
    for namespace, values in sorted(values_by(recording, "esdlock_lost_total", "namespace").items()):
        ax.plot(times, values, label=f"{namespace} lost")
    for namespace, values in sorted(values_by(recording, "esdlock_deadlock_victims_total", "namespace").items()):
        ax.plot(times, values, ":", label=f"{namespace} deadlock victims")
    for outcome, values in sorted(values_by(recording, "esdlock_renewals_total", "outcome").items()):
        if outcome != "ok":
            ax.plot(times, values, "--", label=f"renewals {outcome}")
    _finish(ax, "Losses and failed renewals (total)", "count")

    ax = axes[1][2]
    for (operation, _), values in sorted(
        quantiles_by(recording, "esdlock_store_request_seconds", "operation", (0.99,)).items()
    ):
        ax.plot(times, [v * 1000 for v in values], label=f"{operation} p99")
    _finish(ax, "Store round trips, p99 by operation", "ms", log=True)

    fig.savefig(path, dpi=80)
    plt.close(fig)
    plt.style.use("default")


def _finish(ax: Any, title: str, unit: str, *, log: bool = False) -> None:
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_ylabel(unit)
    ax.set_xlabel("seconds into the run")
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.25)
    if ax.get_lines():
        ax.legend(fontsize=8, ncols=2)
