"""The grant decision, once, in Python: the reference every store's copy is tested against.

Each store decides in its own language (Elasticsearch's ACQUIRE script, the
``esdlock_acquire`` PL/pgSQL function); SQLite runs this one. A differential
test (``tests/test_protocol_model.py``) drives random requests, releases and
lease ends into every store and into this model, and compares the grants.

The rules, for one request (all or nothing) and each node it asks for:

1. **Who counts.** A holder counts if its lease is live, if it carries an
   intent (ended, it awaits recovery: a reaper finishes or frees it), or if
   its lease ended less than the lock delay ago (``LOCK_DELAY``: it was not
   released, so it may still write). The request's own holder id never
   counts: a retry of the same request replaces it.
2. **Modes.** A counting holder blocks the node if its mode is not compatible
   with the asked one (``django_esdlock.modes`` has the one table).
3. **Reentry.** A reentrant request (document locks) counts as taken a node
   it may reenter (``LockRequest.may_reenter()``: one a lock of its thread
   or task holds) where its owner holds a live entry in the same mode; it
   writes nothing there and that node is not among those it takes.
4. **Queues.** A live waiting marker of another request, in a mode that
   conflicts with the asked one, blocks a request queued after it: one
   without a ticket, or with a larger ticket. It does not block where the
   requester's owner holds a live entry (it is inside already; making it
   wait there could only deadlock it with itself).
5. **Semaphores.** A request with a ``holder_limit`` (its one node is a
   semaphore's) is refused where the counting holders and the live markers
   queued before it (any mode; none where the requester's owner holds the
   node) number the standing limit or more. The standing limit is the one
   recorded on the node while anyone counts there, else the request's; a
   grant records it again. So at most that many hold at once, and a waiter
   keeps its place: a newcomer takes only a slot no earlier waiter needs.
6. **All or nothing.** If any node is blocked, the request writes nothing and
   is refused; a request with a ticket leaves its markers on the blocked
   nodes (the SQL stores on each of them; Elasticsearch, which sends fresh and
   known nodes in turn and stops at the first refusal, on those it met, at
   least one). Otherwise it writes a holder on every node it did not reenter.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from . import modes
from .modes import Mode
from .records import LockRequest, Node


class Decision(NamedTuple):
    """What an attempt does: write ``writes`` (a grant), or nothing, leaving markers on ``refused``.

    ``holder_limit``: of a semaphore's request, the limit that stands on its node (rule 5).
    """

    writes: list[tuple[Node, Mode]]
    refused: list[tuple[Node, Mode]]
    holder_limit: int | None = None


def decide(
    request: LockRequest,
    holders: Sequence[Sequence[Any]],
    waiters: Sequence[Sequence[Any]] = (),
    recorded_limits: Mapping[str, int | None] | None = None,
) -> Decision:
    """Judge ``request`` against the holders and live waiting markers of its nodes, by the rules above.

    ``holders`` are rows ``(node_id, holder_id, mode, owner_key, held_on,
    live)``, where ``held_on`` says an ended lease still counts (an intent, or
    the lock delay); ``waiters`` rows ``(node_id, holder_id, mode, ticket)``
    of live markers; ``recorded_limits`` the semaphore limit recorded on each node id.
    """
    by_node: dict[str, list[Sequence[Any]]] = collections.defaultdict(list)
    for row in holders:
        by_node[row[0]].append(row)
    markers: dict[str, list[Sequence[Any]]] = collections.defaultdict(list)
    for row in waiters:
        markers[row[0]].append(row)
    writes, refused = [], []
    standing = None
    for node, mode in dict(request.targets).items():
        reentered = blocked = inside = False
        counting = 0
        for _node_id, holder_id, held_mode, owner_key, held_on, live in by_node[node.id]:
            if holder_id == request.holder_id or not (live or held_on):
                continue
            counting += 1
            inside = inside or (live and owner_key == request.owner.key)
            if request.may_reenter(node) and live and owner_key == request.owner.key and held_mode == mode.value:
                reentered = True
            elif not modes.compatible(held_mode, mode):
                blocked = True
        if not inside:
            blocked = blocked or any(
                holder_id != request.holder_id
                and not modes.compatible(marker_mode, mode)
                and (request.ticket is None or ticket < request.ticket)
                for _node_id, holder_id, marker_mode, ticket in markers[node.id]
            )
        if request.holder_limit is not None:
            recorded = (recorded_limits or {}).get(node.id)
            standing = recorded if counting and recorded else request.holder_limit
            ahead = 0 if inside else sum(1 for row in markers[node.id] if _queued_before(request, row))
            blocked = blocked or counting + ahead >= standing
        if reentered:
            continue
        (refused if blocked else writes).append((node, mode))
    return Decision([] if refused else writes, refused, standing)


def _queued_before(request: LockRequest, marker: Sequence[Any]) -> bool:
    """Whether waiting marker row ``marker`` is of another request queued before ``request``."""
    _node_id, holder_id, _mode, ticket = marker
    return holder_id != request.holder_id and (request.ticket is None or ticket < request.ticket)
