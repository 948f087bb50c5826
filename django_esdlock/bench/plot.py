"""Draw a run's figures with matplotlib (imported only here, for ``--plot``)."""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from .common import Figure, format_facts, format_value
from .suite import Report

COLORS = {"lock": "#1f77b4", "base1": "#9e9e9e", "base2": "#ff7f0e", "good": "#2ca02c", "bad": "#d62728"}
TIMES = "\N{MULTIPLICATION SIGN}"  # the chart may use typography the plain-text table avoids
SHORT_BASELINES = {"raw": "raw pair", "naive": "naive sequence", "row": "1-row pair", "advisory": "advisory pair"}
STORE_TITLES = {"elasticsearch": "Elasticsearch", "postgres": "PostgreSQL", "sqlite": "SQLite"}


def plot(report: Report, path: str) -> None:
    """Write the figures of ``report`` as a PNG chart at ``path``: one panel per question, goals marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key = {f.key: f for f in report.figures}
    stores = [s for s in report.options.stores if any(f.backend == s for f in report.figures)]
    fig, axes = plt.subplots(3, 3, figsize=(18, 14), layout="constrained")
    title = f"django-esdlock lock_bench, {report.options.seconds:g} s per timed figure"
    facts = "\n".join(textwrap.wrap(format_facts(report.facts), width=130))
    fig.suptitle(f"{title}\n{facts}", fontsize=13, fontweight="bold")
    for ax, store in zip(axes[0][:2], ("elasticsearch", "postgres"), strict=True):
        _pairs(ax, by_key, store, report.options.depths)
    _requests(axes[0][2], by_key, stores, report.options.depths)
    _wakeup(axes[1][0], by_key, stores)
    _contention(axes[1][1], by_key, stores, report.options.workers)
    _waits(axes[1][2], by_key, stores)
    _maintenance(axes[2][0], by_key, stores, "reap", "Reaping expired holders", "Reaper.run()", "raw bulk delete")
    _maintenance(
        axes[2][1],
        by_key,
        stores,
        "admin_changelist",
        "Admin changelist of held locks",
        "page render",
        "first page read",
    )
    _goals(axes[2][2], report.figures)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _label_bars(ax: Any, bars: Any, texts: Sequence[str], **kwargs: Any) -> None:
    for bar, text in zip(bars, texts, strict=True):
        if bar.get_height() > 0 and text:
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
                **kwargs,
            )


def _value(figure: Figure | None, attr: str = "value") -> float:
    value = getattr(figure, attr) if figure is not None else math.nan
    return 0.0 if value is None or math.isnan(value) else value


def _pairs(ax: Any, by_key: dict[str, Figure], store: str, depths: Sequence[int]) -> None:
    """Grouped bars per depth: the lock pair and the store's two baselines, ratios over the lock bar."""
    ax.set_title(f"{STORE_TITLES[store]}: tree lock acquire+release pairs/s", fontweight="bold")
    keys = ("raw", "naive") if store == "elasticsearch" else ("row", "advisory")
    figures = [[by_key.get(f"{store}.pair.d{d}.vs_{k}") for k in keys] for d in depths]
    if not any(f for row in figures for f in row):
        ax.text(0.5, 0.5, "not measured", ha="center", transform=ax.transAxes)
        return
    x = range(len(depths))
    width = 0.27
    lock = [_value(row[0]) for row in figures]
    series = [
        ("tree lock", lock, COLORS["lock"]),
        (_first_label(figures, 0), [_value(row[0], "baseline") for row in figures], COLORS["base1"]),
        (_first_label(figures, 1), [_value(row[1], "baseline") for row in figures], COLORS["base2"]),
    ]
    for i, (label, values, color) in enumerate(series):
        bars = ax.bar([p + (i - 1) * width for p in x], values, width, label=label, color=color)
        if i == 0:
            texts = [
                "\n".join(
                    [format_value(value, "/s")]
                    + [f"{f.ratio:.2f}{TIMES} {k}" for f, k in zip(row, keys, strict=True) if f and f.ratio == f.ratio]
                )
                for value, row in zip(lock, figures, strict=True)
            ]
            _label_bars(ax, bars, texts, fontweight="bold")
        else:
            _label_bars(ax, bars, [format_value(v, "/s") for v in values], color="#444444")
    ax.set_xticks(list(x), [f"depth {d}" for d in depths])
    ax.set_ylabel("pairs per second (higher is better)")
    # Linear on purpose: a log axis would make a 20x gap look like a small step.
    ax.margins(y=0.25)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)


def _first_label(figures: list[list[Figure | None]], column: int) -> str:
    for row in figures:
        if row[column] is not None:
            # The naive label names its request count, which changes with depth.
            return row[column].baseline_label.split(" (")[0]
    return ""


def _requests(ax: Any, by_key: dict[str, Figure], stores: Sequence[str], depths: Sequence[int]) -> None:
    ax.set_title("Requests / round trips per acquire (flat is the goal)", fontweight="bold")
    for store, marker in zip(("elasticsearch", "postgres"), ("o", "s"), strict=True):
        values = [_value(by_key.get(f"{store}.requests.d{d}")) for d in depths]
        if store in stores and any(values):
            word = "HTTP requests" if store == "elasticsearch" else "SQL round trips"
            ax.plot(depths, values, marker=marker, linewidth=2, label=f"{STORE_TITLES[store]} ({word})")
            for d, v in zip(depths, values, strict=True):
                ax.annotate(f"{v:g}", (d, v), xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.plot(depths, depths, linestyle="--", color=COLORS["base2"], label="chapter's naive: one request per node")
    ax.set_xlabel("tree depth")
    ax.set_ylabel("per acquire")
    ax.set_xticks(list(depths))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def _wakeup(ax: Any, by_key: dict[str, Figure], stores: Sequence[str]) -> None:
    ax.set_title("Wake-up after release, other process (ms)", fontweight="bold")
    names, p50, p99, floor = [], [], [], []
    for store in stores:
        f50, f99 = by_key.get(f"{store}.wakeup.p50"), by_key.get(f"{store}.wakeup.p99")
        if f50 is None:
            continue
        names.append(STORE_TITLES[store])
        p50.append(_value(f50) * 1000)
        p99.append(_value(f99) * 1000)
        floor.append(_value(f50, "baseline") * 1000)
    x = range(len(names))
    width = 0.27
    for i, (label, values, color) in enumerate(
        (("floor: one uncontended pair", floor, COLORS["base1"]), ("p50", p50, COLORS["lock"]), ("p99", p99, "#6baed6"))
    ):
        bars = ax.bar([p + (i - 1) * width for p in x], values, width, label=label, color=color)
        _label_bars(ax, bars, [f"{v:.1f}" for v in values])
    if "PostgreSQL" in names:
        i = names.index("PostgreSQL")
        ax.hlines(5, i - 0.45, i + 0.45, colors=COLORS["bad"], linestyles="--", label="goal: PostgreSQL p50 ≤ 5 ms")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("milliseconds (lower is better)")
    ax.margins(y=0.2)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _contention(ax: Any, by_key: dict[str, Figure], stores: Sequence[str], workers: int) -> None:
    ax.set_title(f"{workers} processes on one subtree: pairs/s", fontweight="bold")
    names, solo, many = [], [], []
    for store in stores:
        figure = by_key.get(f"{store}.contention.pairs")
        if figure is None:
            continue
        names.append(STORE_TITLES[store])
        solo.append(_value(figure, "baseline"))
        many.append(_value(figure))
    x = range(len(names))
    width = 0.35
    bars = ax.bar([p - width / 2 for p in x], solo, width, label="1 process", color=COLORS["base1"])
    _label_bars(ax, bars, [f"{v:.0f}/s" for v in solo])
    bars = ax.bar([p + width / 2 for p in x], many, width, label=f"{workers} processes", color=COLORS["lock"])
    _label_bars(ax, bars, [f"{v:.0f}/s" for v in many])
    ax.set_xticks(list(x), names)
    ax.set_ylabel("pairs per second, all processes (higher is better)")
    ax.margins(y=0.2)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _waits(ax: Any, by_key: dict[str, Figure], stores: Sequence[str]) -> None:
    """Longest contended wait against a fair turn, writer wait against the longest hold: log scale."""
    ax.set_title("Waiting under load (ms, log scale)", fontweight="bold")
    groups = []
    for store in stores:
        contention = by_key.get(f"{store}.contention.longest_wait")
        writer = by_key.get(f"{store}.writer_wait")
        name = "ES" if store == "elasticsearch" else "PG"
        if contention is not None:
            groups.append((f"{name} contention:\nlongest wait\nvs fair turn", contention))
        if writer is not None:
            groups.append((f"{name} writer on /a:\nwait vs\nlongest hold below", writer))
    x = range(len(groups))
    width = 0.38
    measured = [_value(f) * 1000 for _, f in groups]
    baseline = [_value(f, "baseline") * 1000 for _, f in groups]
    bars = ax.bar([p - width / 2 for p in x], measured, width, color=COLORS["lock"], label="wait")
    texts = []
    for value, (_, f) in zip(measured, groups, strict=True):
        gave_up = "gave up at " if f.extra.get("starved") else ""
        texts.append(f"{gave_up}{value:,.0f}\n{f.ratio:.1f}{TIMES}")
    _label_bars(ax, bars, texts, fontweight="bold")
    bars = ax.bar([p + width / 2 for p in x], baseline, width, color=COLORS["base1"], label="baseline")
    _label_bars(ax, bars, [f"{v:,.0f}" for v in baseline], color="#444444")
    ax.set_xticks(list(x), [g for g, _ in groups], fontsize=8.5)
    ax.set_yscale("log")
    ax.set_ylabel("milliseconds (ratio over the bar)")
    ax.margins(y=0.35)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)


def _maintenance(
    ax: Any, by_key: dict[str, Figure], stores: Sequence[str], key: str, title: str, what: str, floor: str
) -> None:
    figures = [(s, by_key.get(f"{s}.{key}")) for s in stores]
    figures = [(s, f) for s, f in figures if f is not None]
    label = figures[0][1].label.split(", ")[-1] if figures and key == "admin_changelist" else ""
    count = figures[0][1].label.split(" ")[1] if figures and key == "reap" else ""
    ax.set_title(f"{title} ({label or count + ' holders'})", fontweight="bold")
    x = range(len(figures))
    width = 0.35
    values = [_value(f) for _, f in figures]
    baselines = [_value(f, "baseline") for _, f in figures]
    # Seconds once anything takes a second: 15000 ms reads worse than 15 s.
    scale, unit = (1, "seconds") if max(values + baselines, default=0) >= 1 else (1000, "milliseconds")
    bars = ax.bar([p - width / 2 for p in x], [v * scale for v in values], width, color=COLORS["lock"], label=what)
    _label_bars(ax, bars, [format_value(v, "s") for v in values], fontweight="bold")
    bars = ax.bar([p + width / 2 for p in x], [v * scale for v in baselines], width, color=COLORS["base1"], label=floor)
    _label_bars(ax, bars, [format_value(v, "s") for v in baselines])
    goals = {f.goal.limit for _, f in figures if f.goal}
    for limit in goals:
        ax.axhline(limit * scale, color=COLORS["bad"], linestyle="--", label=f"goal < {limit:g} s")
    ax.set_xticks(list(x), [STORE_TITLES[s] for s, _ in figures])
    ax.set_ylabel(f"{unit} (lower is better)")
    ax.margins(y=0.2)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _goals(ax: Any, figures: Sequence[Figure]) -> None:
    """The goals of the run as a checklist: green met, red missed."""
    ax.set_title("Goals", fontweight="bold")
    ax.axis("off")
    goals = [f for f in figures if f.goal is not None and f.key.split(".")[1] != "requests"]
    requests = [f for f in figures if f.key.split(".")[1] == "requests"]
    lines: list[tuple[str, bool | None]] = []
    for f in goals:
        short = {"elasticsearch": "ES", "postgres": "PG", "sqlite": "SQLite"}.get(f.backend, "")
        if f.goal.on == "ratio":
            shown = f"{f.ratio:.2f}{TIMES}"
            goal = f"{'≤' if f.goal.at_most else '≥'} {f.goal.limit:g}{TIMES}"
            label = re.sub(r", \d+ processes below", "", f.label)
            against = SHORT_BASELINES.get(f.key.rsplit(".vs_", 1)[-1], f.baseline_label.split(" (")[0])
            what = f"{label} vs {against}"
        else:
            shown, goal, what = format_value(f.value, f.unit), f.goal.text, f.label
        lines.append((f"{short} {what}: {shown} (goal {goal})".lstrip(), f.met))
    for store in dict.fromkeys(f.backend for f in requests):
        flat = all(f.met for f in requests if f.backend == store)
        lines.append((f"{STORE_TITLES[store]} requests per acquire constant by depth", flat))
    for i, (text, met) in enumerate(lines):
        mark, color = {True: ("✔", COLORS["good"]), False: ("✘", COLORS["bad"]), None: ("?", "#444444")}[met]
        y = 0.95 - i * 0.085
        ax.text(0.0, y, mark, color=color, fontsize=14, fontweight="bold", transform=ax.transAxes, va="center")
        ax.text(0.06, y, text, fontsize=9, transform=ax.transAxes, va="center", wrap=True)
