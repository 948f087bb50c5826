"""What Elasticsearch's answers say: pure readers of ``_bulk`` items, fencing tokens and lock documents.

Apart from the backend so that each rule of reading an answer (granted,
refused, busy, under-replicated, replayed) is one function that a test hits
with a hand-made answer, no store needed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ... import modes
from ...records import HolderRecord, Kind, LockRequest, Node, WaiterRecord, WaitState, from_epoch_ms
from .options import token_floor_of

BUSY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers that mean "not now": rejected executions and circuit breakers (429), an unavailable shard or a
proxy in trouble (502-504). They decide nothing, so the request may be sent again."""

UNDER_REPLICATED = "under_replicated"
"""The error type given to a write the cluster applied on fewer copies than ``wait_for_active_shards`` asked."""

TOKEN_TERM_SHIFT = 40
"""Bits of a fencing token below the primary term: the ``_seq_no`` part (see :func:`token`)."""

SUSPECT_FIELDS = ("holders.id", "holders.mode", "holders.main", "holders.write", "holders.owner.key")
"""What an ACQUIRE of a main node asks back: the ancestor entries that may refuse it (see :func:`suspects`)."""

MARKER_OWNER_FIELDS = ("host", "pid", "thread_name")
"""What a waiting marker records of its owner beside the key: what people read (``deadlock.owner_label``)."""


@dataclasses.dataclass
class AcquireOutcome:
    """How a bulk acquire went, read from its items (see :func:`read_acquire_items`)."""

    taken: list[Node]
    refused: list[Node]
    errors: list[str]
    token: int
    busy: list[str] = dataclasses.field(default_factory=list)
    """Items the store turned away for now (429, 503): neither granted nor refused."""
    ahead: int = 0
    """Of a refused waiting request: the most waiting requests queued before it on one of its nodes."""
    full: list[tuple[Node, int]] = dataclasses.field(default_factory=list)
    """Refused nodes that keep ``max_holders`` holders or more, with their count (see ACQUIRE)."""
    holder_limit: int | None = None
    """Of a semaphore's grant: the limit that stands on its node (the node's, or the request's on a fresh one)."""
    suspects: dict[Node, list[Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    """Refused main nodes, with the ancestor entries there that refuse them and may hold no more (see suspects)."""


def suspects(source: Mapping[str, Any] | None, request: LockRequest, mode: modes.Mode) -> list[Mapping[str, Any]]:
    """Return the entries of a node that refuse ``request``'s ``mode`` there and may have been left behind.

    Those are another holder's IS/IX entries that name their main node
    (``main``, written by this release): their holder may have let go without
    writing here (see "Ancestors" in the protocol).
    """
    if not modes.is_grant(mode):
        return []
    conflicts = {m.value for m in modes.conflicting(mode)}
    return [
        h
        for h in (source or {}).get("holders") or ()
        if h.get("main")
        and h.get("mode") in conflicts
        and h.get("id") != request.holder_id
        and h.get("write") is not None
        and not modes.is_grant(h["mode"])
    ]


def _holds(source: Mapping[str, Any] | None, holder_id: str) -> bool:
    return any(holder.get("id") == holder_id for holder in (source or {}).get("holders") or ())


def _marks(source: Mapping[str, Any] | None, holder_id: str) -> bool:
    """Return True if ``source`` keeps a waiting marker of request ``holder_id``."""
    return any(waiter.get("id") == holder_id for waiter in (source or {}).get("waiters") or ())


def _queued_before(source: Mapping[str, Any] | None, request: LockRequest, mode: modes.Mode) -> int:
    """Count the waiting markers in ``source`` that queue before ``request`` for ``mode`` (a semaphore's: all)."""
    assert request.ticket is not None
    conflicts = {m.value for m in modes.conflicting(mode)}
    return sum(
        1
        for w in (source or {}).get("waiters") or ()
        if w.get("ticket") is not None
        and w["ticket"] < request.ticket
        and (w.get("mode") in conflicts or request.holder_limit is not None)
    )


def read_acquire_items(
    request: LockRequest,
    items: Sequence[Mapping[str, Any]],
    targets: Sequence[tuple[Node, modes.Mode]] | None = None,
    *,
    max_holders: int | None = None,
) -> AcquireOutcome:
    """Sort the items of an acquire ``_bulk`` (of ``targets``, default all the request's) into taken, refused, failed.

    ``created``/``updated`` took the node (a plain ``create`` answers no
    source: it wrote the only holder), except an update with neither a
    holder nor a marker of the request: a reentry (ACQUIRE writes such a node
    back unchanged). ``noop`` is a refusal. A 409 (concurrent
    update or two upserts racing to create the node, after retry_on_conflict)
    wrote nothing: a refusal to retry, never a grant; a busy store's answer
    (429, 503) is neither, and goes to ``busy``. The token is the
    highest ``(_primary_term, _seq_no)`` written, as :func:`token`: it exceeds
    the token of every grant released before any of these writes. A refused
    node whose ``lock_count`` came back at ``max_holders`` or more also goes
    to ``full``.
    """
    outcome = AcquireOutcome([], [], [], 0)
    for (node, mode), item in zip(request.targets if targets is None else targets, items, strict=True):
        body = next(iter(item.values()))
        error = body.get("error")
        if error:
            if body.get("status") in BUSY_STATUSES:
                outcome.busy.append(f"{node}: {described(error)}")
            elif body.get("status") == 409 or error.get("type") == "version_conflict_engine_exception":
                outcome.refused.append(node)
            else:
                outcome.errors.append(f"{node}: {described(error)}")
            continue
        answered = body.get("result")
        source = body.get("get", {}).get("_source")
        if (
            answered == "updated"
            and request.may_reenter(node)
            and not _holds(source, request.holder_id)
            and not _marks(source, request.holder_id)
        ):
            outcome.token = max(outcome.token, token(body))  # reentered: written back unchanged (see ACQUIRE)
        elif (
            answered in ("created", "updated")
            and request.ticket is not None
            and "create" not in item
            and not _holds(source, request.holder_id)
        ):
            outcome.refused.append(node)  # it left a waiting marker, not a holder
            outcome.ahead = max(outcome.ahead, _queued_before(source, request, mode))
            _note_full(outcome, node, source, max_holders)
            _note_suspects(outcome, node, source, request, mode)
        elif answered in ("created", "updated"):
            outcome.taken.append(node)
            outcome.token = max(outcome.token, token(body))
            if request.holder_limit is not None:
                outcome.holder_limit = (source or {}).get("holder_limit") or request.holder_limit
        elif answered == "noop":
            outcome.refused.append(node)
            if request.ticket is not None:
                outcome.ahead = max(outcome.ahead, _queued_before(source, request, mode))
            _note_full(outcome, node, source, max_holders)
            _note_suspects(outcome, node, source, request, mode)
        else:
            outcome.errors.append(f"{node}: unexpected result {answered!r}")
    return outcome


def fresh_node_exists(item: Mapping[str, Any]) -> str | None:
    """Of the item that took a fresh node: "exists" or "failed" (take it with ACQUIRE), or None (read it as is).

    A plain ``create`` answers 409 for a node that exists, the scripted CREATE
    a no-op. Any other failure of a ``create`` wrote nothing either (a missing
    grant pipeline, a node without the ingest role): ACQUIRE takes the node
    instead. None: the item is read as any acquire item (taken, busy, failed).
    """
    ((action, body),) = item.items()
    if action == "update":
        return "exists" if body.get("result") == "noop" else None
    if body.get("status") == 409:
        return "exists"
    if body.get("error") and body.get("status") not in BUSY_STATUSES:
        return "failed"
    return None


def described(error: Mapping[str, Any]) -> str:
    """Return an Elasticsearch error object as ``type: reason``."""
    return f"{error.get('type')}: {error.get('reason')}"


def item_error(item: Mapping[str, Any]) -> str:
    """Return the error of a ``_bulk`` item as ``type: reason``."""
    return described(next(iter(item.values())).get("error") or {})


def _note_full(outcome: AcquireOutcome, node: Node, source: Mapping[str, Any] | None, max_holders: int | None) -> None:
    count = (source or {}).get("lock_count") or 0
    if max_holders is not None and count >= max_holders:
        outcome.full.append((node, count))


def _note_suspects(
    outcome: AcquireOutcome, node: Node, source: Mapping[str, Any] | None, request: LockRequest, mode: modes.Mode
) -> None:
    found = suspects(source, request, mode)
    if found:
        outcome.suspects[node] = found


def merge(first: AcquireOutcome, second: AcquireOutcome) -> AcquireOutcome:
    """Return the outcome of two parts of one acquire, the second sent after the first."""
    return AcquireOutcome(
        first.taken + second.taken,
        first.refused + second.refused,
        first.errors + second.errors,
        max(first.token, second.token),
        first.busy + second.busy,
        max(first.ahead, second.ahead),
        first.full + second.full,
        first.holder_limit or second.holder_limit,
        {**first.suspects, **second.suspects},
    )


def token(body: Mapping[str, Any]) -> int:
    """Return the fencing token of a write: its index's floor + its primary term * 2**40 + its ``_seq_no`` + 1.

    A one-shard index's history is ordered by (primary term, sequence number):
    a new primary continues the sequence under a higher term, and a primary
    an operator forces empty (``allocate_empty_primary``) starts the sequence
    again from 0, also under a higher term. With the term above the sequence,
    tokens keep increasing through both (while the index has written fewer
    than 2**40 operations). A lock index that is lost is recreated under a
    new name whose floor is at least every token this process saw and
    OPTIONS ``token_floor``: tokens keep increasing through that too.
    """
    raw = (int(body.get("_primary_term") or 1) << TOKEN_TERM_SHIFT) + int(body["_seq_no"]) + 1
    return token_floor_of(str(body.get("_index") or "")) + raw


def written_token(body: Mapping[str, Any]) -> int | None:
    """Return the token position of a write that reached its shard (None for a no-op or a failure)."""
    seq_no, term = body.get("_seq_no"), body.get("_primary_term")
    if not isinstance(seq_no, int) or not isinstance(term, int) or seq_no < 0 or term < 1:
        return None
    return token(body)


def result(item: Mapping[str, Any]) -> str | None:
    """Return the ``result`` of a ``_bulk`` item (``created``, ``updated``, ``noop``, ``deleted``, ...)."""
    return next(iter(item.values())).get("result")


def busy(item: Mapping[str, Any]) -> bool:
    """Return whether the store turned a ``_bulk`` item away for now (it may be sent again)."""
    return next(iter(item.values())).get("status") in BUSY_STATUSES


def under_replicated(item: dict[str, Any], required: int | None) -> dict[str, Any]:
    """Return ``item``, or a busy (503) item in its place if it wrote to fewer than ``required`` shard copies.

    ``wait_for_active_shards`` is checked before a write; a copy may still
    fail during it, and the primary then acknowledges with fewer. Such a
    write is not counted: a grant is given back and retried, a renewal is
    not done, as when the store was busy. Refusals (``noop``) and deletes
    are not judged: a lost delete only leaves a holder to its lease.
    """
    ((action, body),) = item.items()
    successful = (body.get("_shards") or {}).get("successful")
    if required is None or body.get("result") not in ("created", "updated") or successful is None:
        return item
    if successful >= required:
        return item
    reason = f"written to {successful} shard copies of the {required} that wait_for_active_shards requires"
    return {action: {**body, "status": 503, "error": {"type": UNDER_REPLICATED, "reason": reason}}}


def markers(source: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Return the waiting markers of a node's ``source``: its ``waiters`` but the release tombstones."""
    return [w for w in source.get("waiters") or () if not w.get("released")]


def released_here(source: Mapping[str, Any], holder_id: str, owner_key: str | None) -> bool:
    """Return True if ``source`` keeps the tombstone of ``holder_id`` released by ``owner_key`` (RELEASE wrote it).

    Only a RELEASE that removed that holder with that owner key writes it, in
    the same write: its presence proves the release was done, by that owner,
    not an eviction, a reaper's take-over or a forced release (whose
    tombstone's ``by`` is null).
    """
    return any(
        w.get("released") and w.get("id") == holder_id and w.get("by") == owner_key for w in source.get("waiters") or ()
    )


def records(source: Mapping[str, Any], holders: Sequence[Mapping[str, Any]] | None = None) -> list[HolderRecord]:
    """Return the holder records of a node's ``source``: of ``holders`` (entries of it), default all its holders."""
    node = Node(source["namespace"], Kind(source["kind"]), source["key"])
    found = []
    for h in source.get("holders") or [] if holders is None else holders:
        mode = modes.Mode(h["mode"])
        main = modes.is_grant(mode)  # an older release copied intent and checkpoint onto every node
        found.append(
            HolderRecord(
                node=node,
                mode=mode,
                holder_id=h["id"],
                owner=h.get("owner", {}),
                token=h.get("token"),
                acquired_at=from_epoch_ms(h.get("acquired_at")),
                expires_at=from_epoch_ms(h["expires_at"]),
                intent=h.get("intent") if main else None,
                checkpoint=h.get("checkpoint") if main else None,
                recovery=h.get("recovery"),
                holder_limit=source.get("holder_limit") if node.kind is Kind.SEMAPHORE else None,
            )
        )
    return found


def hit_records(hit: Mapping[str, Any], keep: Callable[[Mapping[str, Any]], bool] | None = None) -> list[HolderRecord]:
    """Return the records of the holders ``hit`` matched (its inner hits "match"), those ``keep`` accepts."""
    inner = hit.get("inner_hits", {}).get("match")
    holders = [h["_source"] for h in inner["hits"]["hits"]] if inner else []
    return records(hit["_source"], [h for h in holders if keep is None or keep(h)])


def awaits_recovery(holder: Mapping[str, Any]) -> bool:
    """Whether a holder entry carries an intent, here or on its main node: expired, it still blocks."""
    return bool(holder.get("intent") or holder.get("has_intent"))


def evictable(holder: Mapping[str, Any]) -> bool:
    """Whether an expired holder entry may be evicted: it awaits no recovery."""
    return not awaits_recovery(holder)


def _marker_owner(marker: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return who waits, as a marker records it: the owner's key (when it held other locks) and labels."""
    owner = marker.get("owner")
    if isinstance(owner, Mapping):  # a marker of an earlier release: the owner's fields
        return owner
    fields = {name: marker[name] for name in MARKER_OWNER_FIELDS if name in marker}
    return {**fields, "key": owner} if owner else fields


def without_left(records: Sequence[HolderRecord], left: Collection[tuple[str, str]]) -> list[HolderRecord]:
    """Return ``records`` but the ancestor entries left behind (``left``: (node id, holder id) pairs)."""
    return [r for r in records if (r.node.id, r.holder_id) not in left] if left else list(records)


def wait_state_of(
    sources: Sequence[Mapping[str, Any]], now_ms: int, left: Collection[tuple[str, str]] = ()
) -> WaitState:
    """The live markers of node documents and the holders that block there (live, or awaiting recovery).

    ``left``: ancestor entries whose holder let go (see "Ancestors" in the protocol): they block nobody.
    """
    waiters: list[WaiterRecord] = []
    holders: list[HolderRecord] = []
    for source in sources:
        live = [w for w in markers(source) if w.get("expires_at", 0) > now_ms]
        if not live:
            continue
        node = Node(source["namespace"], Kind(source["kind"]), source["key"])
        for w in live:
            expires_at = from_epoch_ms(w["expires_at"])
            assert expires_at is not None
            owner = _marker_owner(w)
            waiters.append(WaiterRecord(node, modes.Mode(w["mode"]), w["id"], owner, w["ticket"], expires_at))
        blocking = [h for h in source.get("holders") or () if h["expires_at"] > now_ms or awaits_recovery(h)]
        holders.extend(without_left(records(source, blocking), left))
    return WaitState(tuple(waiters), tuple(holders))


def version(info: Mapping[str, Any]) -> tuple[int, int]:
    """Return (major, minor) of the cluster's version from its root answer ((0, 0) if unreadable)."""
    number = str((info.get("version") or {}).get("number") or "")
    parts = number.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return 0, 0
