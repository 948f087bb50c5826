"""The wait-for graph between lock owners, built from what the store records: pure logic, no I/O.

A waiting request leaves a marker on each node that refused it (fair
waiting), naming its owner. It waits for an owner when that owner has a
holder on the node in a mode that conflicts with the one asked, or an
earlier waiting request there in such a mode (markers queue later requests,
unless the waiter's own owner holds the node). An owner that itself waits
makes these edges a chain; a chain back to where it began is a deadlock: no
member can move until one gives up.

Every member of a cycle that holds a lock looks for it and each picks the
same victim (the youngest request, whose owner holds a lock: see
``Cycle.victim``), so exactly one gives up; the others go on waiting. A
request whose owner holds nothing is never the victim and never looks: a
crowd contending for one lock costs no detection at all. The victim
confirms the cycle on a second read first: every holder and marker of the
cycle was there in both reads (holder ids are never reused, a granted
request never waits again), so at the start of the second read the whole
cycle stood at once, and a deadlock does not undo itself.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from .modes import Mode, compatible
from .records import HolderRecord, Node, WaiterRecord, WaitState


@dataclasses.dataclass(frozen=True)
class WaitEdge:
    """Request ``waiter`` (of ``waiter_owner``) waits for ``mode`` on ``node``, refused by ``blocker``.

    ``blocker`` is a holder id: a holder's (``queued`` False) or, with
    ``queued``, that of an earlier waiting request the waiter queues behind.
    """

    waiter: str
    waiter_owner: str
    node: Node
    mode: Mode
    blocker: str
    blocker_owner: str
    blocker_mode: Mode
    queued: bool = False

    @property
    def key(self) -> tuple[str, str, Node, str, str]:
        """What must be the same in a second read for this edge to still stand."""
        return (self.waiter, self.waiter_owner, self.node, self.blocker, self.blocker_owner)

    def as_dict(self) -> dict[str, Any]:
        return {
            "waiter": self.waiter,
            "waiter_owner": self.waiter_owner,
            **self.node.as_dict(),
            "mode": self.mode.value,
            "blocker": self.blocker,
            "blocker_owner": self.blocker_owner,
            "blocker_mode": self.blocker_mode.value,
            "queued": self.queued,
        }


@dataclasses.dataclass(frozen=True)
class WaitingRequest:
    """One waiting request, gathered from its markers."""

    holder_id: str
    owner_key: str
    owner: Mapping[str, Any]
    ticket: int
    markers: tuple[WaiterRecord, ...]

    def describe(self) -> str:
        return f"request {self.holder_id[:12]} of {owner_label(self.owner)}"


def owner_label(owner: Mapping[str, Any]) -> str:
    """Return an owner as people read it: host, pid and thread name."""
    return f"{owner.get('host', '?')} pid {owner.get('pid', '?')} {owner.get('thread_name', '')}".strip()


def wait_edges(state: WaitState) -> list[WaitEdge]:
    """Return every edge of the wait-for graph of ``state``, in a stable order."""
    holders_on: dict[Node, list[HolderRecord]] = defaultdict(list)
    for holder in state.holders:
        holders_on[holder.node].append(holder)
    markers_on: dict[Node, list[WaiterRecord]] = defaultdict(list)
    for marker in state.waiters:
        markers_on[marker.node].append(marker)
    edges = []
    for waiter in state.waiters:
        me = waiter.owner_key
        inside = False
        for holder in holders_on[waiter.node]:
            owner = holder.owner_key
            if owner == me:
                inside = True
            elif not compatible(holder.mode, waiter.mode):
                edges.append(
                    WaitEdge(waiter.holder_id, me, waiter.node, waiter.mode, holder.holder_id, owner, holder.mode)
                )
        if inside:
            continue  # the store lets a holder's owner past the queue of its node
        for earlier in markers_on[waiter.node]:
            if earlier.owner_key != me and earlier.ticket < waiter.ticket and not compatible(earlier.mode, waiter.mode):
                edges.append(
                    WaitEdge(
                        waiter.holder_id,
                        me,
                        waiter.node,
                        waiter.mode,
                        earlier.holder_id,
                        earlier.owner_key,
                        earlier.mode,
                        queued=True,
                    )
                )
    return sorted(edges, key=lambda e: (e.waiter, e.blocker_owner, e.node, e.blocker))


def waiting_requests(state: WaitState) -> dict[str, WaitingRequest]:
    """Return the waiting requests of ``state`` by holder id."""
    markers: dict[str, list[WaiterRecord]] = defaultdict(list)
    for marker in state.waiters:
        markers[marker.holder_id].append(marker)
    return {
        holder_id: WaitingRequest(holder_id, found[0].owner_key, found[0].owner, found[0].ticket, tuple(found))
        for holder_id, found in sorted(markers.items())
    }


@dataclasses.dataclass(frozen=True)
class Cycle:
    """A deadlock: ``edges[i]`` leads from ``requests[i]`` to the owner of ``requests[i + 1]`` (wrapping round)."""

    requests: tuple[WaitingRequest, ...]
    edges: tuple[WaitEdge, ...]

    @property
    def victim(self) -> WaitingRequest:
        """The member that gives up: the youngest request (largest ticket; then the largest holder id).

        Its owner holds a lock: a member that is only queued behind (waited
        for by an edge through its marker) is older than the request queued
        behind it, so the youngest is waited for as a holder. A request whose
        owner holds nothing is therefore never a victim and need not look.
        """
        return max(self.requests, key=lambda r: (r.ticket, r.holder_id))

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes the cycle's edges run through (a second read of these confirms it)."""
        return tuple(dict.fromkeys(edge.node for edge in self.edges))

    @property
    def owners(self) -> tuple[str, ...]:
        return tuple(r.owner_key for r in self.requests)

    def describe(self) -> str:
        steps = []
        for request, edge in zip(self.requests, self.edges, strict=True):
            what = "queued behind a waiter in" if edge.queued else "held in"
            steps.append(
                f"{request.describe()} waits for {edge.mode} on {edge.node}, {what} {edge.blocker_mode} "
                f"by {edge.blocker[:12]}"
            )
        return "; ".join(steps) + f"; which waits for the first (victim: {self.victim.holder_id[:12]})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": [r.holder_id for r in self.requests],
            "owners": list(self.owners),
            "edges": [edge.as_dict() for edge in self.edges],
            "victim": self.victim.holder_id,
        }


def find_cycle(state: WaitState, holder_id: str) -> Cycle | None:
    """Return a cycle of the wait-for graph through request ``holder_id``, or None.

    The search is depth first in a stable order, so callers that read the
    same state find the same cycle.
    """
    requests = waiting_requests(state)
    start = requests.get(holder_id)
    if start is None:
        return None
    by_waiter: dict[str, list[WaitEdge]] = defaultdict(list)
    for edge in wait_edges(state):
        by_waiter[edge.waiter].append(edge)
    of_owner: dict[str, list[WaitingRequest]] = defaultdict(list)
    for request in requests.values():
        of_owner[request.owner_key].append(request)

    seen_owners = {start.owner_key}
    path: list[tuple[WaitingRequest, WaitEdge]] = []

    def search(request: WaitingRequest) -> bool:
        for edge in by_waiter[request.holder_id]:
            path.append((request, edge))
            if edge.blocker_owner == start.owner_key:
                return True
            if edge.blocker_owner not in seen_owners:
                seen_owners.add(edge.blocker_owner)
                if any(search(nxt) for nxt in of_owner[edge.blocker_owner]):
                    return True
            path.pop()
        return False

    if not search(start):
        return None
    return Cycle(tuple(r for r, _ in path), tuple(e for _, e in path))


def cycles(state: WaitState) -> list[Cycle]:
    """Return the distinct cycles found through each waiting request (for display)."""
    found: dict[frozenset[str], Cycle] = {}
    for holder_id in waiting_requests(state):
        cycle = find_cycle(state, holder_id)
        if cycle is not None:
            found.setdefault(frozenset(r.holder_id for r in cycle.requests), cycle)
    return list(found.values())


def confirmed(cycle: Cycle, state: WaitState) -> bool:
    """Return True if every edge of ``cycle`` stands in ``state`` (a later read), with the same members."""
    standing = {edge.key for edge in wait_edges(state)}
    return all(edge.key in standing for edge in cycle.edges)
