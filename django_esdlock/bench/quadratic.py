"""The wait-for graph as built before issue 24: every edge listed, a search per request."""

# Kept verbatim (but for imports) as the reference of tests/test_deadlock_graph.py's differential test
# and the baseline of lock_bench's graph figure. It lists n²/2 edges for a queue of n conflicting
# waiters; use django_esdlock.deadlock, which answers the same in near-linear time.

from __future__ import annotations

from collections import defaultdict

from ..deadlock import Cycle, WaitEdge, WaitingRequest, waiting_requests
from ..modes import compatible
from ..records import HolderRecord, Node, WaiterRecord, WaitState


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
