"""lock_check --plot: a timeline of holders per node, with the faults marked (needs matplotlib)."""

from __future__ import annotations

from typing import Any

from .checker import FAULT_SPANS
from .history import operations

MAX_NODES = 40
COLORS = {"X": "tab:red", "S": "tab:blue"}
SPAN_SHADES = {
    "store": ("grey", 0.3),
    "blackhole": ("black", 0.2),
    "latency": ("tab:orange", 0.2),
    "clock": ("tab:green", 0.2),
    "store-restart": ("tab:brown", 0.2),
    "store-failover": ("tab:cyan", 0.2),
}
"""The shade (colour, alpha) of each fault that spans a stretch of the run over every worker (its events:
``checker.FAULT_SPANS``)."""


def plot(result: Any, path: str) -> None:
    """Draw each grant's hold of its S/X nodes as a bar per node; faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = result.events
    origin = events[0]["t"] if events else 0.0
    bars: dict[str, list[tuple[float, float, str, bool]]] = {}
    for op in operations(events).values():
        if not op.granted:
            continue
        start = op.done["t"] - origin  # type: ignore[index]
        end = max(op.span_end, (op.release or op.done)["t"]) - origin  # type: ignore[index]
        for _ns, kind, key, mode in op.nodes:
            if mode in ("S", "X"):
                name = key if kind == "tree" else f"{kind}:{key}"
                bars.setdefault(name, []).append((start, max(end - start, 0.002), mode, op.lost is not None))
    names = sorted(bars)[:MAX_NODES]
    fig, ax = plt.subplots(figsize=(14, max(3, 0.3 * len(names) + 1.5)))
    for row, name in enumerate(names):
        for start, width, mode, lost in bars[name]:
            ax.broken_barh(
                [(start, width)],
                (row - 0.35, 0.7),
                facecolors=COLORS[mode],
                alpha=0.55 if mode == "S" else 0.8,
                hatch="//" if lost else None,
                edgecolor="black" if lost else None,
            )
    paused: dict[str, float] = {}
    down: dict[str, float] = {}
    begins = {FAULT_SPANS[fault][0]: fault for fault in SPAN_SHADES}
    ends = {FAULT_SPANS[fault][1]: fault for fault in SPAN_SHADES}
    spans: dict[str, float] = {}
    for e in events:
        t = e["t"] - origin
        if e["type"] == "pause":
            paused[e["victim"]] = t
        elif e["type"] == "resume":
            ax.axvspan(paused.pop(e["victim"], t), t, color="gold", alpha=0.25, lw=0)
        elif e["type"] == "kill":
            ax.axvline(t, color="black", ls="--", lw=1)
        elif e["type"] in begins:
            spans[begins[e["type"]]] = t
        elif e["type"] in ends and ends[e["type"]] in spans:
            colour, alpha = SPAN_SHADES[ends[e["type"]]]
            ax.axvspan(spans.pop(ends[e["type"]]), t, color=colour, alpha=alpha, lw=0)
        elif e["type"] == "node_kill":
            down[e["node"]] = t
            ax.axvline(t, color="purple", lw=1.5)
        elif e["type"] == "node_restarted" and e["node"] in down:
            ax.axvspan(down.pop(e["node"]), t, color="purple", alpha=0.12, lw=0)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("seconds")
    ax.set_title(
        f"lock_check {result.backend}: {len(result.violations)} violations\n"
        "X red, S blue, lost hatched; pauses gold, store cuts grey, kills dashed, Elasticsearch nodes down purple;\n"
        "black holes black, slow links orange, skewed clocks green, store restarts brown, store failovers cyan",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
