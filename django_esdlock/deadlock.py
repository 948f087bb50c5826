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

A semaphore (a node of kind ``sem``) is held by all its holders: a request
refused there waits for each of them, and for every request queued before
it there, whatever the modes. Any one of them leaving lets it in, though,
so it is deadlocked only if each of them is in its deadlock: a waiter with
a holder outside (one that may leave) is not, and the graph is read again
without it (see ``WaitForGraph``).

Reading the graph costs near-linear time in the markers and holders read
(see ``WaitForGraph``): a crowd of thousands queued on one lock is the moment
someone opens the waiting page, and the moment it must still answer.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import gc
import sys
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from .modes import Mode, compatible
from .records import HolderRecord, Kind, Node, WaiterRecord, WaitState


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


def edge_order(edge: WaitEdge) -> tuple[str, str, Node, str]:
    """The stable order of edges: by waiting request, then by the owner, node and holder id it waits for."""
    return (edge.waiter, edge.blocker_owner, edge.node, edge.blocker)


_CONFLICTS: dict[Mode, tuple[Mode, ...]] = {
    asked: tuple(held for held in Mode if not compatible(held, asked)) for asked in Mode
}
"""For each mode asked, the modes that refuse it, in a fixed order."""


def _conflicts_at(node: Node, asked: Mode) -> tuple[Mode, ...]:
    """The held (or queued) modes that refuse ``asked`` on ``node``: every mode on a semaphore."""
    return tuple(Mode) if node.kind is Kind.SEMAPHORE else _CONFLICTS[asked]


def _blocks(node: Node, held: Mode, asked: Mode) -> bool:
    """Whether a holder (or an earlier marker) in ``held`` on ``node`` refuses ``asked`` there."""
    return node.kind is Kind.SEMAPHORE or not compatible(held, asked)


def _semaphore_waits_that_stand(state: WaitState) -> WaitState:
    """``state`` without the requests waiting on a semaphore one of whose holders is outside their deadlock.

    Such a holder may leave and let the request in: it is not deadlocked
    there (its markers on a semaphore are its only ones: a semaphore's
    request has one node). Read again until none is left out.
    """
    while any(marker.node.kind is Kind.SEMAPHORE for marker in state.waiters):
        graph = WaitForGraph(state, settled=True)
        deadlocked = graph._deadlocked
        free = set()
        for marker in state.waiters:
            if marker.node.kind is not Kind.SEMAPHORE:
                continue
            owners = deadlocked.get(marker.owner_key, frozenset())
            if any(h.node == marker.node and h.owner_key not in owners for h in state.holders):
                free.add(marker.holder_id)
        if not free:
            break
        state = WaitState(tuple(m for m in state.waiters if m.holder_id not in free), state.holders)
    return state


class WaitForGraph:
    """The wait-for graph of one read of the store, indexed once: its edges, deadlocked owners and cycles.

    A marker waits for every holder of its node in a conflicting mode and,
    unless its owner holds the node, for every earlier marker there in a
    conflicting mode; never for its own owner. That relation has n²/2 pairs
    for a queue of n conflicting waiters, so it is never listed whole:

    - :attr:`edges` are what people read: each marker's conflicting holders,
      and per conflicting mode only the nearest earlier marker of another
      owner (which itself queues behind, or is, the next one of the queue);
    - owners are grouped into strongly connected components (one iterative
      Tarjan pass) on a graph of O(markers + holders) vertices and edges with
      the relation's reachability between owners: a marker points at one
      vertex per conflicting mode standing for all holders of its node in
      that mode, and at one vertex of a chain per mode that stands for the
      markers of the node in that mode up to the last one older than itself
      (each chain vertex points at its marker's owner and at the one before).
      Such a path leads exactly to the owners the relation names, and at
      worst to the marker's own owner as well, which joins no two owners;
      so two owners are in one component iff each waits, through others, for
      the other: a deadlock;
    - :meth:`find_cycle` runs the depth-first search of the relation, in its
      order, among the owners of the start's component only. Leaving the
      others out changes nothing: an owner the start's owner waits for but
      that does not wait back for it (outside the component) leads only to
      such owners, never back; so the cycle found is the one a search of the
      whole relation finds. Each step asks for the next owner by key
      without listing a request's edges, in O(log n) (see ``_Component``).
    """

    def __init__(self, state: WaitState, *, settled: bool = False) -> None:
        """Index ``state``; ``settled``: it has no semaphore waiter to leave out of deadlocks (see above)."""
        self.state = state
        self._settled = settled
        self.requests: dict[str, WaitingRequest] = waiting_requests(state)
        # Each record's owner key, worked out once (by the record's identity: records hold dicts, no hash).
        self._key: dict[int, str] = {id(r): r.owner_key for records in (state.holders, state.waiters) for r in records}
        key = self._key
        self._held_in: dict[tuple[Node, Mode], list[HolderRecord]] = defaultdict(list)
        for holder in state.holders:
            self._held_in[(holder.node, holder.mode)].append(holder)
        # The store lets a holder's owner past the queue of its node: its markers there queue behind nobody.
        self._inside = {(holder.node, key[id(holder)]) for holder in state.holders}
        queues: dict[tuple[Node, Mode], list[WaiterRecord]] = defaultdict(list)
        for marker in state.waiters:
            queues[(marker.node, marker.mode)].append(marker)
        self._queue = {key: sorted(markers, key=lambda m: m.ticket) for key, markers in queues.items()}
        self._tickets = {key: [m.ticket for m in markers] for key, markers in self._queue.items()}
        self._of_owner: dict[str, list[WaitingRequest]] = defaultdict(list)
        for request in self.requests.values():
            self._of_owner[request.owner_key].append(request)
        self._components: dict[frozenset[str], _Component] = {}

    # --- what people read -----------------------------------------------------

    @functools.cached_property
    def edges(self) -> list[WaitEdge]:
        """Each marker's conflicting holders and, per conflicting mode, the nearest earlier marker of another owner.

        At most four queued edges a marker: the page and ``reap_locks`` show
        a queue as a chain, where a search for deadlocks follows every pair.
        """
        key = self._key
        edges = []
        for marker in self.state.waiters:
            me = key[id(marker)]
            for mode in _conflicts_at(marker.node, marker.mode):
                for holder in self._held_in.get((marker.node, mode), ()):
                    blocker = key[id(holder)]
                    if blocker != me:
                        edges.append(_holder_edge(marker, me, holder, blocker))
            if (marker.node, me) in self._inside:
                continue
            for mode in _conflicts_at(marker.node, marker.mode):
                earlier = self._nearest_earlier(marker, me, mode)
                if earlier is not None:
                    edges.append(_queued_edge(marker, me, earlier, key[id(earlier)]))
        return sorted(edges, key=edge_order)

    def _nearest_earlier(self, marker: WaiterRecord, me: str, mode: Mode) -> WaiterRecord | None:
        """Return the latest marker in ``mode`` on ``marker``'s node older than it, of another owner than ``me``."""
        tickets = self._tickets.get((marker.node, mode))
        if not tickets:
            return None
        queue = self._queue[(marker.node, mode)]
        at = bisect.bisect_left(tickets, marker.ticket) - 1
        while at >= 0 and self._key[id(queue[at])] == me:
            at -= 1
        return queue[at] if at >= 0 else None

    # --- deadlocks --------------------------------------------------------------

    @functools.cached_property
    def _deadlocked(self) -> dict[str, frozenset[str]]:
        """The owners in a deadlock, each with the owners of its strongly connected component (two or more)."""
        key_of = self._key
        vertex_of: dict[str, int] = {}
        tails: list[int] = []  # the graph's edges, as two flat lists: few objects for the collector to track
        heads: list[int] = []
        count = 0

        def owner(key: str) -> int:
            nonlocal count
            found = vertex_of.get(key)
            if found is None:
                found = vertex_of[key] = count
                count += 1
            return found

        all_held: dict[tuple[Node, Mode], int] = {}
        for key, holders in self._held_in.items():
            group = all_held[key] = count
            count += 1
            for holder in holders:
                tails.append(group)
                heads.append(owner(key_of[id(holder)]))
        chains: dict[tuple[Node, Mode], int] = {}  # the vertex of a queue's first marker; the others follow it
        for key, queue in self._queue.items():
            first = chains[key] = count
            count += len(queue)
            for at, marker in enumerate(queue):
                tails.append(first + at)
                heads.append(owner(key_of[id(marker)]))
                if at:
                    tails.append(first + at)
                    heads.append(first + at - 1)
        for marker in self.state.waiters:
            mine = key_of[id(marker)]
            me = owner(mine)
            queued = (marker.node, mine) not in self._inside
            for mode in _conflicts_at(marker.node, marker.mode):
                key = (marker.node, mode)
                if key in all_held:
                    tails.append(me)
                    heads.append(all_held[key])
                if queued and key in chains:
                    older = bisect.bisect_left(self._tickets[key], marker.ticket)
                    if older:
                        tails.append(me)
                        heads.append(chains[key] + older - 1)
        component = strong_components(count, tails, heads)
        members: dict[int, list[str]] = defaultdict(list)
        for key, at in vertex_of.items():
            members[component[at]].append(key)
        deadlocked: dict[str, frozenset[str]] = {}
        for owners in members.values():
            if len(owners) > 1:
                together = frozenset(owners)
                deadlocked.update(dict.fromkeys(together, together))
        return deadlocked

    @functools.cached_property
    def _judge(self) -> WaitForGraph:
        """The graph deadlocks are judged on: this one, less the semaphore waits that may end (see above)."""
        if self._settled:
            return self
        settled = _semaphore_waits_that_stand(self.state)
        return self if settled is self.state else WaitForGraph(settled, settled=True)

    @property
    def deadlocks(self) -> list[frozenset[str]]:
        """The owner keys of each deadlock: a strongly connected component of two or more owners."""
        return sorted(set(self._judge._deadlocked.values()), key=min)

    def find_cycle(self, holder_id: str) -> Cycle | None:
        """Return a cycle through request ``holder_id``, or None: see :func:`find_cycle`."""
        if self._judge is not self:
            return self._judge.find_cycle(holder_id)
        start = self.requests.get(holder_id)
        if start is None:
            return None
        owners = self._deadlocked.get(start.owner_key)
        if owners is None:
            return None
        return self._search(start, owners)

    def _search(self, start: WaitingRequest, owners: frozenset[str]) -> Cycle | None:
        component = self._components.get(owners)
        if component is None:
            holders, queues = self._records_by_deadlock
            component = self._components[owners] = _Component(self, owners, holders[owners], queues[owners])
        return component.search(start)

    @functools.cached_property
    def _records_by_deadlock(
        self,
    ) -> tuple[
        dict[frozenset[str], list[HolderRecord]], dict[frozenset[str], dict[tuple[Node, Mode], list[WaiterRecord]]]
    ]:
        """The holders, and the queues (by ticket), of each deadlock's owners: one pass for every deadlock."""
        deadlocked, key_of = self._deadlocked, self._key
        holders: dict[frozenset[str], list[HolderRecord]] = defaultdict(list)
        for holder in self.state.holders:
            owners = deadlocked.get(key_of[id(holder)])
            if owners is not None:
                holders[owners].append(holder)
        queues: dict[frozenset[str], dict[tuple[Node, Mode], list[WaiterRecord]]] = defaultdict(dict)
        for key, queue in self._queue.items():
            for marker in queue:
                owners = deadlocked.get(key_of[id(marker)])
                if owners is not None:
                    queues[owners].setdefault(key, []).append(marker)
        return holders, queues

    def cycles(self) -> list[Cycle]:
        """Return one cycle per deadlock (component): see :func:`cycles`."""
        if self._judge is not self:
            return self._judge.cycles()
        found = []
        for owners in self.deadlocks:
            requests = sorted((r for o in owners for r in self._of_owner.get(o, ())), key=lambda r: r.holder_id)
            for request in requests:
                cycle = self._search(request, owners)
                if cycle is not None:
                    found.append((request.holder_id, cycle))
                    break
        return [cycle for _, cycle in sorted(found, key=lambda item: item[0])]

    # --- a second read ------------------------------------------------------------

    @functools.cached_property
    def _at(self) -> tuple[dict[tuple[str, Node], list[HolderRecord]], dict[tuple[str, Node], list[WaiterRecord]]]:
        holders: dict[tuple[str, Node], list[HolderRecord]] = defaultdict(list)
        for holder in self.state.holders:
            holders[(holder.holder_id, holder.node)].append(holder)
        markers: dict[tuple[str, Node], list[WaiterRecord]] = defaultdict(list)
        for marker in self.state.waiters:
            markers[(marker.holder_id, marker.node)].append(marker)
        return holders, markers

    def stands(self, edge: WaitEdge) -> bool:
        """Return True if the relation has an edge with ``edge``'s :attr:`~WaitEdge.key` in this read."""
        holders_at, markers_at = self._at
        for marker in markers_at.get((edge.waiter, edge.node), ()):
            me = marker.owner_key
            if me != edge.waiter_owner or edge.blocker_owner == me:
                continue
            for holder in holders_at.get((edge.blocker, edge.node), ()):
                if holder.owner_key == edge.blocker_owner and _blocks(marker.node, holder.mode, marker.mode):
                    return True
            if (marker.node, me) in self._inside:
                continue
            for earlier in markers_at.get((edge.blocker, edge.node), ()):
                if (
                    earlier.owner_key == edge.blocker_owner
                    and earlier.ticket < marker.ticket
                    and _blocks(marker.node, earlier.mode, marker.mode)
                ):
                    return True
        return False


_GONE = sys.maxsize
"""The rank of a removed entry: after every owner's."""


class _LeastRank:
    """Owner ranks at positions 0…n-1: the least of the first ``end`` in O(log n); entries go as owners are met."""

    def __init__(self, ranks: list[int]) -> None:
        size = 1
        while size < len(ranks):
            size *= 2
        tree = [_GONE] * (2 * size)
        tree[size : size + len(ranks)] = ranks
        for at in range(size - 1, 0, -1):
            tree[at] = min(tree[2 * at], tree[2 * at + 1])
        self._size, self._tree = size, tree

    def remove(self, position: int) -> None:
        tree = self._tree
        at = position + self._size
        tree[at] = _GONE
        at //= 2
        while at:
            tree[at] = min(tree[2 * at], tree[2 * at + 1])
            at //= 2

    def least(self, end: int) -> int:
        tree = self._tree
        low, high, least = self._size, self._size + end, _GONE
        while low < high:
            if low & 1:
                least = min(least, tree[low])
                low += 1
            if high & 1:
                high -= 1
                least = min(least, tree[high])
            low //= 2
            high //= 2
        return least


class _Component:
    """One deadlock's owners and their records, indexed for the depth-first search of :meth:`WaitForGraph.find_cycle`.

    The search takes a request's edges in :func:`edge_order`, by owner key
    first, and skips owners it met; so it asks, at each step, for the
    smallest owner key the request waits for that it has not met. Owners are
    ranked by key; a holder group (node, mode) is read in rank order with one
    cursor per search (met owners only accumulate), a queue (node, mode) by
    ticket with a tree of least ranks over its prefixes, from which a met
    owner's markers are removed. Each step costs O(log n), not a request's
    every edge: the crowd of a deadlock can be thousands of owners.
    """

    def __init__(
        self,
        graph: WaitForGraph,
        owners: frozenset[str],
        holders: list[HolderRecord],
        queues: dict[tuple[Node, Mode], list[WaiterRecord]],
    ) -> None:
        """Index ``owners``' ``holders`` (in the order of the read) and ``queues`` (by ticket)."""
        self.graph = graph
        self.key = key_of = graph._key
        self.keys = sorted(owners)
        self.rank = {key: at for at, key in enumerate(self.keys)}
        held: dict[tuple[Node, Mode], list[int]] = defaultdict(list)
        self.holders_of: dict[str, list[HolderRecord]] = defaultdict(list)
        for holder in holders:
            owner = key_of[id(holder)]
            held[(holder.node, holder.mode)].append(self.rank[owner])
            self.holders_of[owner].append(holder)
        self.held = {key: sorted(ranks) for key, ranks in held.items()}
        self.queued: dict[tuple[Node, Mode], tuple[list[int], list[int]]] = {}
        self.position: dict[int, int] = {}  # each marker's place in its queue, by the marker's identity
        for key, queue in queues.items():
            self.queued[key] = ([m.ticket for m in queue], [self.rank[key_of[id(m)]] for m in queue])
            self.position.update((id(m), at) for at, m in enumerate(queue))

    def search(self, start: WaitingRequest) -> Cycle | None:
        """The depth-first search of :func:`find_cycle` from ``start``, among this component's owners.

        From a request, the owners it waits for by key, each through its first
        edge in :func:`edge_order`; through an owner not met yet, each of its
        requests by holder id. Iterative: a ring of thousands of owners is no
        recursion.
        """
        goal = start.owner_key
        goal_rank = self.rank[goal]
        met = bytearray(len(self.keys))
        cursors: dict[tuple[Node, Mode], int] = {}
        trees: dict[tuple[Node, Mode], _LeastRank] = {}

        def meet(rank: int) -> None:
            met[rank] = 1
            for request in self.graph._of_owner.get(self.keys[rank], ()):
                for marker in request.markers:
                    tree = trees.get((marker.node, marker.mode))
                    if tree is not None:
                        tree.remove(self.position[id(marker)])

        def least(sources: list[tuple[tuple[Node, Mode], int | None]]) -> int:
            """The least rank not met among ``sources``: holder groups (no end) and queue prefixes."""
            found = _GONE
            for key, end in sources:
                if end is None:
                    ranks = self.held[key]
                    at = cursors.get(key, 0)
                    while at < len(ranks) and met[ranks[at]]:
                        at += 1
                    cursors[key] = at
                    rank = ranks[at] if at < len(ranks) else _GONE
                else:
                    tree = trees.get(key)
                    if tree is None:
                        ranks = self.queued[key][1]
                        tree = trees[key] = _LeastRank([_GONE if met[r] else r for r in ranks])
                    rank = tree.least(end)
                found = min(found, rank)
            return found

        meet(goal_rank)
        path: list[tuple[WaitingRequest, WaitEdge]] = []
        # A request's frame: [request, where its blockers are, whether it waits for the goal]; an owner's:
        # [its requests, next request].
        frames: list[list[Any]] = [[start, self._sources(start), False]]
        while frames:
            frame = frames[-1]
            if len(frame) == 3:
                request, sources, waits_for_goal = frame
                rank = least(sources)
                if waits_for_goal and goal_rank < rank:
                    path.append((request, self._first_edge(request, goal)))
                    return Cycle(tuple(r for r, _ in path), tuple(e for _, e in path))
                if rank == _GONE:
                    frames.pop()
                    continue
                blocker = self.keys[rank]
                meet(rank)
                path.append((request, self._first_edge(request, blocker)))
                frames.append([self.graph._of_owner.get(blocker, []), 0])
            else:
                requests, at = frame
                if at == len(requests):
                    frames.pop()
                    path.pop()  # no way back through this owner
                    continue
                frame[1] = at + 1
                request = requests[at]
                frames.append([request, self._sources(request), self._first_edge(request, goal) is not None])
        return None

    def _sources(self, request: WaitingRequest) -> list[tuple[tuple[Node, Mode], int | None]]:
        """Where the owners ``request`` waits for are: holder groups, and queue prefixes (up to an end)."""
        sources: list[tuple[tuple[Node, Mode], int | None]] = []
        for marker in request.markers:
            queued = (marker.node, self.key[id(marker)]) not in self.graph._inside
            for mode in _conflicts_at(marker.node, marker.mode):
                key = (marker.node, mode)
                if key in self.held:
                    sources.append((key, None))
                if queued and key in self.queued:
                    end = bisect.bisect_left(self.queued[key][0], marker.ticket)
                    if end:
                        sources.append((key, end))
        return sources

    def _markers_of(self, owner: str) -> list[WaiterRecord]:
        """The markers of ``owner``'s requests; each request's in the order of the read.

        Only the order of markers of one request could decide between two
        edges (the same blocker id on the same node), as it did before.
        """
        return [m for r in self.graph._of_owner.get(owner, ()) for m in r.markers]

    def _first_edge(self, request: WaitingRequest, owner: str) -> WaitEdge | None:
        """The first edge in :func:`edge_order` from ``request`` to ``owner``, or None if it does not wait for it."""
        first: WaitEdge | None = None
        for marker in request.markers:
            me = self.key[id(marker)]
            if owner == me:
                continue
            node = marker.node
            edges = [
                _holder_edge(marker, me, h, owner)
                for h in self.holders_of.get(owner, ())
                if h.node == node and _blocks(node, h.mode, marker.mode)
            ]
            if (node, me) not in self.graph._inside:
                edges += [
                    _queued_edge(marker, me, m, owner)
                    for m in self._markers_of(owner)
                    if m.node == node and m.ticket < marker.ticket and _blocks(node, m.mode, marker.mode)
                ]
            for edge in edges:
                if first is None or (edge.node, edge.blocker) < (first.node, first.blocker):
                    first = edge
        return first


def _holder_edge(marker: WaiterRecord, me: str, holder: HolderRecord, owner: str) -> WaitEdge:
    return WaitEdge(marker.holder_id, me, marker.node, marker.mode, holder.holder_id, owner, holder.mode)


def _queued_edge(marker: WaiterRecord, me: str, earlier: WaiterRecord, owner: str) -> WaitEdge:
    return WaitEdge(marker.holder_id, me, marker.node, marker.mode, earlier.holder_id, owner, earlier.mode, True)


def strong_components(count: int, tails: list[int], heads: list[int]) -> list[int]:
    """Return the strongly connected component of each of ``count`` vertices (Tarjan's algorithm, iterative).

    Edge ``i`` runs from ``tails[i]`` to ``heads[i]``. Components are numbered
    in the order they complete.
    """
    # The edges out of each vertex, contiguous (a counting sort by tail).
    starts = [0] * (count + 1)
    for tail in tails:
        starts[tail + 1] += 1
    for v in range(count):
        starts[v + 1] += starts[v]
    fill = starts[:-1]
    out = [0] * len(heads)
    for tail, head in zip(tails, heads, strict=True):
        out[fill[tail]] = head
        fill[tail] += 1
    index = [-1] * count
    low = [0] * count
    on_stack = [False] * count
    component = [-1] * count
    following = starts[:-1]  # the next edge to follow out of each vertex
    stack: list[int] = []
    path: list[int] = []
    visited = components = 0
    for root in range(count):
        if index[root] != -1:
            continue
        index[root] = low[root] = visited
        visited += 1
        stack.append(root)
        on_stack[root] = True
        path.append(root)
        while path:
            v = path[-1]
            at = following[v]
            if at < starts[v + 1]:
                following[v] = at + 1
                w = out[at]
                if index[w] == -1:
                    index[w] = low[w] = visited
                    visited += 1
                    stack.append(w)
                    on_stack[w] = True
                    path.append(w)
                elif on_stack[w] and index[w] < low[v]:
                    low[v] = index[w]
                continue
            path.pop()
            if path and low[v] < low[path[-1]]:
                low[path[-1]] = low[v]
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    component[w] = components
                    if w == v:
                        break
                components += 1
    return component


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a read of the graph; restore it after.

    Reading n records keeps O(n) new objects alive until the read is done,
    none in a reference cycle (reference counting frees them). Meanwhile
    the collector would walk the whole process (a Django process tracks
    some 100,000 objects) once per few ten thousand of them: at 10,000
    waiting requests that costs as much as the read. Left alone if the
    application turned the collector off; a thread allocating meanwhile
    only collects later.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def wait_edges(state: WaitState) -> list[WaitEdge]:
    """Return the edges of ``state`` people read (:attr:`WaitForGraph.edges`), in :func:`edge_order`."""
    return list(WaitForGraph(state).edges)


def find_cycle(state: WaitState, holder_id: str) -> Cycle | None:
    """Return a cycle of the wait-for graph through request ``holder_id``, or None.

    The search is depth first in a stable order (each request's edges in
    :func:`edge_order`, each owner's requests by holder id), over every
    edge of the relation among the owners of the request's deadlock, so
    callers that read the same state find the same cycle.
    """
    with collector_paused():
        return WaitForGraph(state).find_cycle(holder_id)


def cycles(state: WaitState) -> list[Cycle]:
    """Return one cycle per deadlock (a strongly connected component of owners), for display.

    Each is the cycle :func:`find_cycle` finds through the component's first
    request (by holder id) that lies on one; they come in that order. Where
    a component is one ring of owners, as a deadlock usually is, that is
    every cycle there is; a component that knots several rings together
    shows one of them (:attr:`WaitForGraph.deadlocks` has every member).
    """
    with collector_paused():
        return WaitForGraph(state).cycles()


def confirmed(cycle: Cycle, state: WaitState) -> bool:
    """Return True if every edge of ``cycle`` stands in ``state`` (a later read), with the same members."""
    graph = WaitForGraph(state)
    return all(graph.stands(edge) for edge in cycle.edges)
