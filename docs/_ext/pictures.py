"""Sphinx extension: draw the docs' diagrams with matplotlib at build time, from the package's own code.

On ``builder-inited`` it writes three SVG files into ``docs/_generated/``
(gitignored), which pages include as ``/_generated/<name>.svg``:

``modes.svg``
    The compatibility matrix of the lock modes, read from
    ``django_esdlock.modes`` (rows: the held mode, columns: the requested one).
``tree.svg``
    The lock tree of the chapter's file system with two holders; each
    holder's modes come from ``lock_tree``'s own targets
    (``django_esdlock.core.tree_targets``), and ``django_esdlock.protocol.decide``
    checks that the example is right (the second holder granted beside the
    first, the third request refused) before it is drawn.
``handoff.svg``
    The sequence of a hand-off: the view acquires, hands the lock off, the
    task worker claims the ticket, keeps the lease and releases it.

A picture is drawn again when this file, or the package modules it reads,
changed since it was drawn, or when it is missing. The SVG output is
deterministic (fixed ``svg.hashsalt``, no date).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import django_esdlock

PICTURES = ("modes", "tree", "handoff")
PACKAGE = Path(django_esdlock.__file__).resolve().parent
# What the pictures are drawn from: drawn again when one of these changes.
SOURCES = [
    Path(__file__).resolve(),
    PACKAGE / "modes.py",
    PACKAGE / "protocol.py",
    PACKAGE / "core.py",
    PACKAGE / "paths.py",
    PACKAGE / "records.py",
]

GREEN, GREEN_FILL = "#1b5e20", "#c8e6c9"
RED, RED_FILL = "#b71c1c", "#ffcdd2"
INK, GREY = "#222222", "#777777"
PROCESS_COLOURS = {"A": "#b23b3b", "B": "#1f5fa8", "C": "#7a5a00"}


# --- the mode matrix -------------------------------------------------------------------------------


def draw_modes(path: Path) -> None:
    """The compatibility matrix, straight from ``django_esdlock.modes``."""
    from matplotlib.figure import Figure

    from django_esdlock import modes

    order = list(modes.Mode)
    fig = Figure(figsize=(4.2, 3.5))
    ax = fig.add_axes((0.2, 0.04, 0.76, 0.74))
    n = len(order)
    for row, held in enumerate(order):
        for col, requested in enumerate(order):
            ok = held not in modes.conflicting(requested)
            ax.add_patch(_rect(col, n - 1 - row, GREEN_FILL if ok else RED_FILL))
            ax.text(
                col + 0.5,
                n - 0.5 - row,
                "yes" if ok else "no",
                ha="center",
                va="center",
                fontsize=12,
                weight="bold",
                color=GREEN if ok else RED,
            )
    for i, mode in enumerate(order):
        ax.text(i + 0.5, n + 0.12, mode.value, ha="center", va="bottom", fontsize=12, weight="bold", color=INK)
        ax.text(-0.12, n - 0.5 - i, mode.value, ha="right", va="center", fontsize=12, weight="bold", color=INK)
    ax.text(n / 2, n + 0.62, "requested", ha="center", va="bottom", fontsize=11, color=GREY)
    ax.text(-0.62, n / 2, "held", ha="right", va="center", fontsize=11, color=GREY, rotation=90)
    ax.set_xlim(-0.02, n + 0.02)
    ax.set_ylim(-0.02, n + 0.02)
    ax.set_axis_off()
    _save(fig, path)


def _rect(x: float, y: float, colour: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, facecolor=colour, edgecolor="white", linewidth=3)


# --- the lock tree ---------------------------------------------------------------------------------

README = "/clinton/projects/elasticsearch/README.txt"
SIBLING = "/clinton/projects/django"
PARENT = "/clinton/projects"


def _tree_example() -> tuple[dict[str, list[tuple[str, str]]], list[tuple[str, str]]]:
    """Return the holders of each node (``{path: [(process, mode), ...]}``) and what C's request meets.

    A takes ``lock_tree(README)``, B ``lock_tree(SIBLING, shared=True)``; C
    asks ``lock_tree(PARENT, shared=True)``. ``protocol.decide`` must grant A,
    then B beside A, and refuse C: otherwise the example is wrong and the
    build fails here.
    """
    from django_esdlock import modes, protocol
    from django_esdlock.core import tree_targets
    from django_esdlock.records import LockRequest, Owner

    def request(process: str, path: str, shared: bool) -> LockRequest:
        owner = Owner("host", ord(process), 1, "MainThread", f"process-{process}")
        targets = tree_targets(path, shared=shared, namespace="fs", intent=None)
        return LockRequest(f"holder-{process}", owner, targets, ttl=60.0)

    holders: list[tuple[Any, ...]] = []  # protocol.decide's rows
    held: dict[str, list[tuple[str, str]]] = {}
    for process, path, shared in (("A", README, False), ("B", SIBLING, True)):
        req = request(process, path, shared)
        decision = protocol.decide(req, holders)
        if decision.refused or len(decision.writes) != len(req.targets):
            raise RuntimeError(f"pictures: the tree example is wrong: {process} is not granted {path}")
        for node, mode in decision.writes:
            holders.append((node.id, req.holder_id, mode.value, req.owner.key, False, True))
            held.setdefault(node.key, []).append((process, mode.value))
    req = request("C", PARENT, True)
    decision = protocol.decide(req, holders)
    if not decision.refused:
        raise RuntimeError(f"pictures: the tree example is wrong: C is granted {PARENT}")
    blocked_by = [
        (process, mode)
        for node, asked in req.targets
        if node.key == PARENT
        for process, mode in held.get(node.key, [])
        if not modes.compatible(mode, asked)
    ]
    return held, blocked_by


def draw_tree(path: Path) -> None:
    """The chapter's file system locked by A (X on README.txt) and B (S on a sibling directory)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    from django_esdlock import modes

    held, blocked_by = _tree_example()
    rows = ["/clinton", PARENT, "/clinton/projects/elasticsearch", README, SIBLING]
    depth = {p: p.count("/") - 1 for p in rows}
    step, height, indent, left, right = 13.5, 9.5, 4.5, 1.5, 62.0
    fig = Figure(figsize=(9.0, 3.9))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 100)
    ax.set_ylim(100 - len(rows) * step - 2, 100)
    ax.set_axis_off()

    y_of: dict[str, float] = {}
    for i, node in enumerate(rows):
        x, y = left + depth[node] * indent, 98 - i * step
        y_of[node] = y
        holders = held.get(node, [])
        box = FancyBboxPatch(
            (x, y - height),
            right - x,
            height,
            boxstyle="round,pad=0,rounding_size=1.2",
            facecolor="#f6f6f6",
            edgecolor="#999999",
            linewidth=1,
        )
        ax.add_patch(box)
        ax.text(x + 1.2, y - 2.9, node, ha="left", va="center", fontsize=9.5, family="monospace", color=INK)
        cursor = x + 1.2
        for process, mode in holders:
            ax.text(
                cursor,
                y - 6.9,
                f"{process}: {mode}",
                ha="left",
                va="center",
                fontsize=9,
                weight="bold",
                color=PROCESS_COLOURS[process],
            )
            cursor += 7
        kind = modes.lock_type([m for _, m in holders])
        ax.text(
            right - 1.2,
            y - 6.9,
            f"lock_type {kind}, lock_count {len(holders)}",
            ha="right",
            va="center",
            fontsize=7.5,
            color=GREY,
        )
        if depth[node]:
            # An elbow from the parent's box down to this one.
            parent = node.rsplit("/", 1)[0]
            px = left + depth[parent] * indent + 2
            ax.plot([px, px, x], [y_of[parent] - height, y - height / 2, y - height / 2], color="#999999", lw=1)

    legend_x = 65
    ax.text(legend_x, 97, "Holders", fontsize=9.5, weight="bold", color=INK, va="top")
    notes = [
        ("A", 'lock_tree(".../README.txt")', "X on the file, IX on its parents"),
        ("B", 'lock_tree("/clinton/projects/django",', "  shared=True): S on it, IS on its parents"),
    ]
    y = 90
    for process, call, modes_taken in notes:
        ax.text(legend_x, y, f"{process}:", fontsize=8.5, weight="bold", color=PROCESS_COLOURS[process], va="top")
        ax.text(legend_x + 3.5, y, call, fontsize=7.5, family="monospace", color=INK, va="top")
        ax.text(legend_x + 3.5, y - 3.6, modes_taken, fontsize=7.5, color=INK, va="top")
        y -= 10.5
    blockers = ", ".join(f"{p}'s {m}" for p, m in blocked_by)
    ax.text(legend_x, y, "C:", fontsize=8.5, weight="bold", color=PROCESS_COLOURS["C"], va="top")
    ax.text(legend_x + 3.5, y, 'lock_tree("/clinton/projects",', fontsize=7.5, family="monospace", color=INK, va="top")
    ax.text(legend_x + 3.5, y - 3.6, "  shared=True) waits: S there", fontsize=7.5, color=INK, va="top")
    ax.text(legend_x + 3.5, y - 7.2, f"  conflicts with {blockers}", fontsize=7.5, color=INK, va="top")
    ax.text(legend_x, y - 13.5, "A and B hold /clinton and /clinton/projects", fontsize=7.5, color=GREY, va="top")
    ax.text(legend_x, y - 17.1, "at once: IS and IX are compatible.", fontsize=7.5, color=GREY, va="top")
    _save(fig, path)


# --- the hand-off sequence -------------------------------------------------------------------------


def draw_handoff(path: Path) -> None:
    """A hand-off as ``locks.Lock.handoff`` and ``handoff.resume_lock`` do it."""
    from matplotlib.figure import Figure

    lanes = {"web": 14, "store": 50, "worker": 86}
    titles = {"web": "web process (view)", "store": "lock store", "worker": "task worker"}
    fig = Figure(figsize=(8.6, 6.6))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    ax.set_axis_off()
    for lane, x in lanes.items():
        ax.text(
            x,
            97,
            titles[lane],
            ha="center",
            va="center",
            fontsize=10,
            weight="bold",
            color=INK,
            bbox={"boxstyle": "round,pad=0.4", "facecolor": "#eeeeee", "edgecolor": "#999999"},
        )
        ax.plot([x, x], [3, 94.5], color="#aaaaaa", lw=1, ls=(0, (4, 3)), zorder=0)

    def message(y: float, src: str, dst: str, text: str, reply: bool = False, colour: str = INK) -> None:
        x0, x1 = lanes[src], lanes[dst]
        ax.annotate(
            "",
            xy=(x1, y),
            xytext=(x0, y),
            arrowprops={
                "arrowstyle": "-|>",
                "color": colour,
                "lw": 1.1,
                "ls": "--" if reply else "-",
                "shrinkA": 0,
                "shrinkB": 0,
            },
        )
        ax.text(
            (x0 + x1) / 2,
            y + 0.9,
            text,
            ha="center",
            va="bottom",
            fontsize=7.8,
            color=colour,
            linespacing=1.25,
            zorder=3,
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85},
        )

    def note(y: float, lane: str, text: str, side: str = "right", colour: str = GREY) -> None:
        x = lanes[lane] + (1.5 if side == "right" else -1.5)
        ax.text(
            x,
            y,
            text,
            ha="left" if side == "right" else "right",
            va="center",
            fontsize=7.3,
            color=colour,
            style="italic",
            linespacing=1.25,
        )

    def span(y0: float, y1: float, lane: str, colour: str) -> None:
        x = lanes[lane]
        ax.add_patch(_bar(x, y0, y1, colour))

    web, worker, lease = PROCESS_COLOURS["A"], PROCESS_COLOURS["B"], "#e0a800"
    # The view holds the lock from its grant to the hand-off; the store keeps the ticket's lease
    # (nobody renews it) until the claim; the worker holds it from the claim to its release.
    span(86.5, 63, "web", web)
    span(63, 40, "store", lease)
    span(40, 10, "worker", worker)

    message(
        89,
        "web",
        "store",
        "with lock_tree(path, intent=..., timeout=0) as lock:\nacquire: IX on the parents, X on path",
    )
    message(83, "store", "web", "grant: holder h, token t", reply=True)
    note(77, "web", "renewed every TTL/3\nwhile the view holds it")
    message(69.5, "web", "store", "ticket = lock.handoff(ttl=300):\nlease of h = store's now + 300 s")
    message(64.5, "store", "web", "renewed", reply=True)
    note(
        59,
        "web",
        "renewing stops; the ticket\n(signed with SECRET_KEY) names\nh, its nodes, owner, token t,\n"
        "intent, last checkpoint",
    )
    message(50.5, "web", "worker", "rename_task.enqueue(path, dst, ticket=ticket)   (through the task queue)")
    note(45.5, "web", "end of the with block:\nrelease() gives nothing back")
    note(
        59, "store", "h stays held; nobody renews it:\nthe ticket is valid until\nits lease runs out", colour="#8a6d00"
    )
    message(
        36.5,
        "worker",
        "store",
        "with resume_lock(ticket) as lock:\n"
        "take_over(..., require_live=True): only while\nh's lease runs and h has the view's owner",
    )
    message(29, "store", "worker", "grant: same holder h, intent, checkpoint;\nnew token t' > t", reply=True)
    message(
        21.5,
        "worker",
        "store",
        "renew every TTL/3: the lease is kept\n(lock.checkpoint(...) as it goes)",
        colour=worker,
    )
    message(13.5, "worker", "store", "end of the with block: release(h)")
    message(8.5, "store", "worker", "h removed: the path is free", reply=True)
    note(4.5, "web", "a second claim of the ticket, or one after its lease ran out, raises LockLost")
    _save(fig, path)


def _bar(x: float, y0: float, y1: float, colour: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.8, y1), 1.6, y0 - y1, facecolor=colour, edgecolor="none", alpha=0.35, zorder=1)


# --- Sphinx -----------------------------------------------------------------------------------------

DRAWERS = {"modes": draw_modes, "tree": draw_tree, "handoff": draw_handoff}


def _save(fig: Any, path: Path) -> None:
    import matplotlib

    # Written aside and moved in place: a build running beside this one never reads half a file.
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    with matplotlib.rc_context({"svg.hashsalt": "django-esdlock", "svg.fonttype": "path"}):
        fig.savefig(partial, format="svg", metadata={"Date": None}, facecolor="white")
    os.replace(partial, path)


def _fingerprint() -> str:
    import matplotlib

    digest = hashlib.sha256(matplotlib.__version__.encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    return digest.hexdigest()


def draw_all(outdir: Path, *, force: bool = False) -> list[str]:
    """Draw the pictures into ``outdir`` that are missing or whose sources changed; return their names."""
    import matplotlib

    matplotlib.use("Agg")
    outdir.mkdir(parents=True, exist_ok=True)
    stamp = outdir / ".sources"
    fingerprint = _fingerprint()
    fresh = not force and stamp.exists() and stamp.read_text() == fingerprint
    drawn = []
    for name in PICTURES:
        target = outdir / f"{name}.svg"
        if fresh and target.exists():
            continue
        DRAWERS[name](target)
        drawn.append(name)
    if drawn or not fresh:
        stamp.write_text(fingerprint)
    return drawn


def builder_inited(app: Any) -> None:
    from sphinx.util import logging

    drawn = draw_all(Path(app.srcdir) / "_generated")
    if drawn:
        logging.getLogger(__name__).info("pictures: drew %s", ", ".join(f"{n}.svg" for n in drawn))


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", builder_inited)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
