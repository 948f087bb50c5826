"""Timing, percentiles and the one table of a benchmark run: every figure beside its baseline."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal


def percentile(values: Sequence[float], fraction: float) -> float:
    """Return the ``fraction`` quantile of ``values`` (nearest rank); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def tree_path(depth: int) -> str:
    """Return a path ``depth`` segments deep: ``/d1/d2/…/leaf`` (``/leaf`` at depth 1)."""
    return "/" + "/".join([*(f"d{i}" for i in range(1, depth)), "leaf"])


@dataclasses.dataclass
class Rate:
    """How often one operation ran in a measured time, and how long each run took."""

    count: int = 0
    elapsed: float = 0.0
    latencies: list[float] = dataclasses.field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.count / self.elapsed if self.elapsed else math.nan

    @property
    def median(self) -> float:
        return percentile(self.latencies, 0.5)


def interleaved_rates(
    operations: Mapping[str, Callable[[], Any]], seconds: float, *, slices: int = 5
) -> dict[str, Rate]:
    """Run each operation back to back for ``seconds`` in all, ``slices`` turns each, round robin.

    Taking turns makes a figure and its baselines share the store's slow
    moments (a checkpoint, a merge) instead of one of them getting all of
    them. Each operation runs once unmeasured first (index creation,
    connection setup, prepared scripts).
    """
    for operation in operations.values():
        operation()
    rates = {name: Rate() for name in operations}
    turn = seconds / slices
    for _ in range(slices):
        for name, operation in operations.items():
            rate = rates[name]
            started = time.perf_counter()
            stop = started + turn
            now = started
            while now < stop:
                operation()
                finished = time.perf_counter()
                rate.latencies.append(finished - now)
                rate.count += 1
                now = finished
            rate.elapsed += now - started
    return rates


@dataclasses.dataclass(frozen=True)
class Goal:
    """A target a figure should meet: its ratio at least/at most ``limit``, or its value at most ``limit``."""

    on: Literal["ratio", "value"]
    at_most: bool
    limit: float
    text: str

    def met(self, figure: Figure) -> bool | None:
        measured = figure.ratio if self.on == "ratio" else figure.value
        if measured is None or math.isnan(measured):
            return None
        return measured <= self.limit if self.at_most else measured >= self.limit


def ratio_at_least(limit: float) -> Goal:
    return Goal("ratio", False, limit, f"≥ {limit:g}x")


def ratio_at_most(limit: float) -> Goal:
    return Goal("ratio", True, limit, f"≤ {limit:g}x")


def value_at_most(limit: float, text: str) -> Goal:
    return Goal("value", True, limit, text)


@dataclasses.dataclass
class Figure:
    """One measured figure next to its baseline, measured in the same run.

    ``key`` names the figure for machines (``postgres.pair.d4.vs_row``);
    ``value`` and ``baseline`` share ``unit``; ``ratio`` is value / baseline.
    """

    key: str
    backend: str
    label: str
    value: float
    unit: str
    baseline_label: str
    baseline: float
    goal: Goal | None = None
    note: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ratio(self) -> float:
        if not self.baseline or math.isnan(self.baseline) or math.isnan(self.value):
            return math.nan
        return self.value / self.baseline

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.goal.met(self)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "backend": self.backend,
            "label": self.label,
            "value": _finite(self.value),
            "unit": self.unit,
            "baseline_label": self.baseline_label,
            "baseline": _finite(self.baseline),
            "ratio": _finite(self.ratio),
            "goal": self.goal.text if self.goal else None,
            "met": self.met,
            "note": self.note,
            **({"extra": _json_ready(self.extra)} if self.extra else {}),
        }


def _finite(value: float) -> float | None:
    """JSON has no NaN: a figure that could not be measured is null."""
    return None if value is None or math.isnan(value) or math.isinf(value) else float(f"{value:.6g}")


def _json_ready(value: Any) -> Any:
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, Mapping):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def format_value(value: float, unit: str) -> str:
    """Return ``value`` in ``unit`` for a person: 1234/s, 3.21 ms, 1.5 s, 2 req."""
    if value is None or math.isnan(value):
        return "n/a"
    if unit == "/s":
        return f"{value:,.0f}/s" if value >= 100 else f"{value:.1f}/s"
    if unit == "s":
        return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.2f}".rstrip("0").rstrip(".") + f" {unit}"


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: ""}[met]


def format_table(figures: Sequence[Figure]) -> str:
    """Return the run as one plain-text table, one figure a line, grouped by backend."""
    header = ("store", "figure", "value", "baseline (same run)", "", "ratio", "goal", "")
    rows = [header]
    for f in figures:
        ratio = "n/a" if math.isnan(f.ratio) else f"{f.ratio:.2f}x"
        rows.append(
            (
                f.backend,
                f.label,
                format_value(f.value, f.unit),
                f.baseline_label,
                format_value(f.baseline, f.unit),
                ratio,
                f.goal.text if f.goal else "",
                _verdict(f.met),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    right = {2, 4, 5}  # numbers line up on the right

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    lines = [line(header), "  ".join("-" * w for w in widths)]
    previous = None
    for f, row in zip(figures, rows[1:], strict=True):
        if previous is not None and f.backend != previous:
            lines.append("")
        previous = f.backend
        lines.append(line(row))
    notes = [f"  {f.backend} {f.label}: {f.note}" for f in figures if f.note]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def format_facts(facts: Mapping[str, Any]) -> str:
    """Return the facts of a run that change how to read it, as one line: CPUs, load, store settings."""
    parts = [f"{facts.get('cpus')} CPUs"]
    before, after = facts.get("loadavg_before"), facts.get("loadavg_after")
    if before and after:
        parts.append(f"load average {before[0]:.2f} before, {after[0]:.2f} after")
    if facts.get("wake_floor") is not None:
        parts.append(f"an idle process sees a pipe message after {facts['wake_floor'] * 1000:.2f} ms (p50)")
    if "elasticsearch" in facts:
        parts.append(str(facts["elasticsearch"].get("server")))
    if "postgres" in facts:
        pg = facts["postgres"]
        parts.append(
            f"PostgreSQL {str(pg.get('server_version', '')).split()[0]} fsync={pg.get('fsync')} "
            f"synchronous_commit={pg.get('synchronous_commit')}"
        )
    if "sqlite" in facts:
        lite = facts["sqlite"]
        parts.append(f"SQLite {lite.get('sqlite_version')} journal_mode={lite.get('journal_mode')}")
    return "; ".join(parts)
