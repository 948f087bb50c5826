"""The wait-for graph as people read it, for the admin's waiting page and ``reap_locks``: pure logic, no I/O."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .deadlock import Cycle, WaitEdge, WaitForGraph, WaitingRequest, collector_paused, edge_order, owner_label
from .records import WaitState

SHOWN = 100
"""How many waiting requests, deadlocks and edges the waiting page and ``reap_locks`` show at most, each.

They count the rest: a crowd of thousands is when people look, and a page of
thousands of rows would not answer.
"""


def request_dict(request: WaitingRequest) -> dict[str, Any]:
    """Return a JSON-ready view of one waiting request: who, since when, waiting for what."""
    first = request.markers[0]
    return {
        "holder_id": request.holder_id,
        "owner": dict(request.owner),
        "since": first.since.isoformat(),
        "waits_for": [{**m.node.as_dict(), "mode": m.mode.value} for m in request.markers],
        "expires_at": max(m.expires_at for m in request.markers).isoformat(),
    }


@dataclasses.dataclass(frozen=True)
class WaitGraph:
    """The waiting requests of a store, what each waits for, and the deadlocks among them.

    ``edges`` are :attr:`WaitForGraph.edges <django_esdlock.deadlock.WaitForGraph.edges>`
    (a queue reads as a chain) and every edge of the cycles shown. ``owners``
    gives the owner fields of every holder id in the graph: the holders that
    block and the waiting requests.
    """

    requests: tuple[WaitingRequest, ...]
    edges: tuple[WaitEdge, ...]
    cycles: tuple[Cycle, ...]
    owners: Mapping[str, Mapping[str, Any]]

    @classmethod
    def of(cls, state: WaitState, namespace: str | None = None) -> WaitGraph:
        """Build the graph of ``state``; with ``namespace``, keep what touches a node of that namespace.

        Cycles are found on the whole state (one may run through several
        namespaces) and kept when one of their edges is on ``namespace``.
        """
        with collector_paused():
            return cls._of(state, namespace)

    @classmethod
    def _of(cls, state: WaitState, namespace: str | None) -> WaitGraph:
        graph = WaitForGraph(state)  # every edge, component and cycle below comes from this one index
        requests = sorted(graph.requests.values(), key=lambda r: (r.ticket, r.holder_id))
        found = graph.cycles()
        edges = graph.edges
        # A cycle may run along an edge the chain of a queue leaves out (to an earlier waiter than the nearest).
        in_cycles = {e for c in found for e in c.edges}
        waiters = {e.waiter for e in in_cycles}
        missing = in_cycles.difference(e for e in edges if e.waiter in waiters)
        if missing:
            edges = sorted([*edges, *missing], key=edge_order)
        if namespace is not None:
            requests = [r for r in requests if any(m.node.namespace == namespace for m in r.markers)]
            edges = [e for e in edges if e.node.namespace == namespace]
            found = [c for c in found if any(n.namespace == namespace for n in c.nodes)]
        owners: dict[str, Mapping[str, Any]] = {h.holder_id: h.owner for h in state.holders}
        owners.update((w.holder_id, w.owner) for w in state.waiters)
        return cls(tuple(requests), tuple(edges), tuple(found), owners)

    def blocker_label(self, edge: WaitEdge) -> str:
        """Return who ``edge`` waits for as people read it (the owner key when the owner's fields are unknown)."""
        owner = self.owners.get(edge.blocker)
        return owner_label(owner) if owner else edge.blocker_owner

    @property
    def cycle_edges(self) -> frozenset[tuple[Any, ...]]:
        """The keys (:attr:`WaitEdge.key`) of the edges that are part of some cycle."""
        return frozenset(edge.key for cycle in self.cycles for edge in cycle.edges)

    @property
    def victims(self) -> frozenset[str]:
        """The holder ids of the requests that give up, one per cycle."""
        return frozenset(cycle.victim.holder_id for cycle in self.cycles)

    def as_dict(self, limit: int | None = None) -> dict[str, Any]:
        """Return the graph JSON-ready; with ``limit``, at most that many requests, edges and cycles each."""
        return {
            "requests": [request_dict(r) for r in self.requests[:limit]],
            "edges": [edge.as_dict() for edge in self.edges[:limit]],
            "cycles": [cycle.as_dict() for cycle in self.cycles[:limit]],
        }

    def counts(self, limit: int | None = None) -> dict[str, int]:
        """How many requests, edges and cycles there are, and how many of each :meth:`as_dict` shows."""
        return {
            "waiting_requests": len(self.requests),
            "waiting_edges": len(self.edges),
            "cycles": len(self.cycles),
            "waiting_requests_shown": len(self.requests[:limit]),
            "waiting_edges_shown": len(self.edges[:limit]),
            "cycles_shown": len(self.cycles[:limit]),
        }


# --- a small drawing of the graph: owners on a circle, an arrow per waiting pair of owners

DRAW_LIMIT = 30
"""Draw at most this many owners; past it the picture says less than the table."""


def drawing(graph: WaitGraph, *, radius: int = 32) -> dict[str, Any] | None:
    """Return what the waiting page's SVG needs: owner circles and arrows; None if nothing or too much to draw.

    Owners are the vertices (a deadlock is between owners); an arrow runs from
    a waiting owner to each owner it waits for, red when a cycle uses it. Two
    owners that wait for each other get two arrows side by side.
    """
    waiting = {r.owner_key: r.owner for r in graph.requests}
    owner_of = dict(waiting)
    drawn: dict[str, None] = {}
    for edge in graph.edges:
        drawn.update(dict.fromkeys((edge.waiter_owner, edge.blocker_owner)))
        if len(drawn) > DRAW_LIMIT:
            return None  # a crowd: stop reading, it is not drawn
        owner_of.setdefault(edge.blocker_owner, graph.owners.get(edge.blocker, {}))
    keys = list(drawn)
    if not keys:
        return None
    # A ring that leaves room for an arrow and its label between neighbours.
    ring = 0.0 if len(keys) == 1 else max(80.0, len(keys) * 5 * radius / (2 * math.pi))
    size = round(2 * (ring + radius + 30))
    centre = size / 2
    step = 2 * math.pi / len(keys)
    at = {key: (centre + ring * math.sin(i * step), centre - ring * math.cos(i * step)) for i, key in enumerate(keys)}
    in_cycle = {(e.waiter_owner, e.blocker_owner) for c in graph.cycles for e in c.edges}
    victims = {c.victim.owner_key for c in graph.cycles}
    arrows = []
    labels: dict[tuple[str, str], list[str]] = {}
    for edge in graph.edges:
        labels.setdefault((edge.waiter_owner, edge.blocker_owner), []).append(f"{edge.mode} {edge.node.key}")
    for (waiter, blocker), what in labels.items():
        (x1, y1), (x2, y2) = at[waiter], at[blocker]
        length = math.hypot(x2 - x1, y2 - y1) or 1.0
        ux, uy = (x2 - x1) / length, (y2 - y1) / length
        # Offset sideways so that A→B and B→A do not draw over each other.
        ox, oy = -uy * 6, ux * 6
        arrows.append(
            {
                "x1": round(x1 + ux * radius + ox, 1),
                "y1": round(y1 + uy * radius + oy, 1),
                "x2": round(x2 - ux * (radius + 4) + ox, 1),
                "y2": round(y2 - uy * (radius + 4) + oy, 1),
                "lx": round((x1 + x2) / 2 + ox * 3, 1),
                "ly": round((y1 + y2) / 2 + oy * 3, 1),
                "label": ", ".join(dict.fromkeys(what)),
                "cycle": (waiter, blocker) in in_cycle,
            }
        )
    owners = [
        {
            "x": round(at[key][0], 1),
            "y": round(at[key][1], 1),
            "pid": str(owner_of.get(key, {}).get("pid", "?")),
            "thread": str(owner_of.get(key, {}).get("thread_name", ""))[:10],
            "title": owner_label(owner_of.get(key, {})),
            "victim": key in victims,
            "waiting": key in waiting,
        }
        for key in keys
    ]
    return {"size": size, "radius": radius, "owners": owners, "arrows": arrows}
