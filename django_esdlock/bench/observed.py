"""What watching the locks costs: tree lock pairs with metrics and spans on against both off, in one run.

"On" is what a deployment that exports both runs: the metrics on a registry
of the run's own, spans recorded by the OpenTelemetry SDK (when installed)
and handed to a batch processor whose exporter drops them (no network in
the figure). "Off" is neither; the metrics alone are measured beside them
(``extra``), and so is the CPU this process spends per pair in each
(steadier than rates on a shared machine). They take turns (``interleaved_rates``),
switched by :func:`django_esdlock.observability.use`; the goal is at most
3 % slower (``≥ 0.97x``) on every store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import observability
from ..locks import lock_tree
from ..observability.state import installed
from .common import Figure, interleaved_rates, ratio_at_least, tree_path
from .kit import StoreKit

Say = Callable[[str], None]

NAMESPACE = "bench-observed"
DEPTH = 4
GOAL = ratio_at_least(0.97)
SLICES = 30


SAMPLED = 0.01
"""The share of traces the "sampled" variant records (the SDK's ``TraceIdRatioBased``), as a busy site would."""


def _recording_provider(ratio: float = 1.0) -> Any:
    """A tracer provider that records ``ratio`` of the traces and drops them in a batch exporter; None without
    the SDK."""
    if not installed("opentelemetry.sdk"):
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider() if ratio >= 1.0 else TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    return provider


def watched_state(ratio: float = 1.0) -> tuple[observability.State, dict[str, bool]]:
    """Metrics and spans on (``ratio`` of the traces recorded), as far as the libraries are installed; and which
    are."""
    metrics = tracing = None
    if installed("prometheus_client"):
        from prometheus_client import CollectorRegistry

        from ..observability.metrics import metrics_on

        metrics = metrics_on(CollectorRegistry())
    provider = _recording_provider(ratio)
    if provider is not None:
        from ..observability.tracing import LockTracing

        tracing = LockTracing(provider)
    state = observability.State(metrics, tracing, observability.DEFAULT_SLOW_WAIT)
    return state, {"metrics": metrics is not None, "spans_recorded": tracing is not None}


def cpu_per_call(operations: dict[str, Callable[[], None]], *, calls: int, turns: int = 10) -> dict[str, float]:
    """CPU seconds of this process (every thread) per call of each operation, taking ``turns`` turns.

    Steadier than rates on a shared machine: what others run there delays a
    pair, but does not add to the CPU this process spends on it.
    """
    spent = dict.fromkeys(operations, 0.0)
    per_turn = max(1, calls // turns)
    for _ in range(turns):
        for name, operation in operations.items():
            started = time.process_time()
            for _ in range(per_turn):
                operation()
            spent[name] += time.process_time() - started
    return {name: total / (per_turn * turns) for name, total in spent.items()}


def figures(kit: StoreKit, seconds: float, say: Say) -> list[Figure]:
    """Tree lock pairs/s at depth 4 with metrics and spans on, against both off."""
    say(f"{kit.name}: lock pairs with metrics and spans on against off")
    on, recorded = watched_state()
    off = observability.State(None, None, None)
    path = tree_path(DEPTH)

    def pair(state: observability.State) -> Callable[[], None]:
        def run() -> None:
            observability.use(state)
            with lock_tree(path, namespace=NAMESPACE, backend=kit.backend):
                pass

        return run

    sampled, _ = watched_state(SAMPLED)
    operations = {
        "on": pair(on),
        "off": pair(off),
        "metrics": pair(observability.State(on.metrics, None, None)),
        "sampled": pair(sampled),
    }
    try:
        # Many short turns: on a shared machine, load comes and goes within a second.
        rates = interleaved_rates(operations, seconds, slices=SLICES)
        cpu = cpu_per_call(operations, calls=max(20, min(rate.count for rate in rates.values()) // 2))
    finally:
        observability.use(None)
    return [
        Figure(
            key=f"{kit.name}.observability.pair",
            backend=kit.name,
            label=f"tree lock pairs/s, depth {DEPTH}, metrics and spans on",
            value=rates["on"].per_second,
            unit="/s",
            baseline_label="both off",
            baseline=rates["off"].per_second,
            goal=GOAL,
            extra={
                **recorded,
                "median_on_s": rates["on"].median,
                "median_off_s": rates["off"].median,
                "metrics_only_per_s": rates["metrics"].per_second,
                **{f"cpu_us_per_pair_{name}": round(spent * 1e6, 1) for name, spent in cpu.items()},
            },
        ),
        Figure(
            key=f"{kit.name}.observability.sampled_pair",
            backend=kit.name,
            label=f"tree lock pairs/s, depth {DEPTH}, metrics on, {SAMPLED:.0%} of traces recorded",
            value=rates["sampled"].per_second,
            unit="/s",
            baseline_label="both off",
            baseline=rates["off"].per_second,
            goal=GOAL,
            extra={**recorded, "median_sampled_s": rates["sampled"].median},
        ),
    ]
