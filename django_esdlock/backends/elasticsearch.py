"""Elasticsearch lock store: the chapter's lock documents, one per node, holders inside."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import inspect
import itertools
import json
import logging
import math
import os
import re
import time
import urllib.parse
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .. import modes, paths
from ..exceptions import InvalidLockBackend, LockBackendUnavailable, LockStoreBusy
from ..forks import ForkSafeLock
from ..records import (
    Grant,
    HolderPage,
    HolderRecord,
    Kind,
    LockRequest,
    Node,
    Owner,
    WaiterRecord,
    WaitState,
    from_epoch_ms,
)
from ..redaction import add_secrets, credential_values, redact, url_secrets
from . import elasticsearch_scripts as scripts
from .base import (
    BaseLockBackend,
    StoreFeatures,
    backoff_delay,
    close_per_loop,
    expires_ms,
    renew_params,
    takeover_request,
)

try:
    import elasticsearch
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImproperlyConfigured(
        "The Elasticsearch lock backend needs the 'elasticsearch' package: pip install 'django-esdlock[elasticsearch]'"
    ) from e

MAPPING_VERSION = 3

logger = logging.getLogger("django_esdlock")

T = TypeVar("T")

_ALREADY_EXISTS = "resource_already_exists_exception"
_NOT_FOUND = "index_not_found_exception"
_TAKEN_BY_OTHERS = frozenset({_ALREADY_EXISTS, "illegal_state_exception", "invalid_alias_name_exception", _NOT_FOUND})
"""What index creation and alias swaps answer when another process changed the lock index first."""

TOKEN_FLOOR_LIMIT = 2**62
"""OPTIONS ``token_floor`` stays below this: a token (floor + term * 2**40 + seq_no) must fit a signed long."""

INCARNATION_TRIES = 8
"""Rounds of looking at a lock index and creating or replacing its concrete index before giving up."""

_OWNER = {
    "properties": {
        "host": {"type": "keyword"},
        "pid": {"type": "long"},
        "thread": {"type": "keyword"},
        "thread_name": {"type": "keyword"},
        "process": {"type": "keyword"},
        "started": {"type": "keyword"},
        "pidns": {"type": "keyword"},
        "key": {"type": "keyword"},
    }
}

MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "_meta": {"django_esdlock": {"mapping_version": MAPPING_VERSION}},
    "properties": {
        "namespace": {"type": "keyword"},
        "kind": {"type": "keyword"},
        "key": {"type": "keyword"},
        "parent": {"type": "keyword"},
        "depth": {"type": "integer"},
        # The chapter's views, kept in step with `holders` by every script.
        "lock_type": {"type": "keyword"},
        "lock_count": {"type": "integer"},
        "modes": {"type": "keyword"},
        "holders": {
            "type": "nested",
            "properties": {
                "id": {"type": "keyword"},
                "mode": {"type": "keyword"},
                "token": {"type": "long"},
                "owner": _OWNER,
                "acquired_at": {"type": "date", "format": "epoch_millis"},
                "expires_at": {"type": "date", "format": "epoch_millis"},
                # Intent and checkpoint are kept on the holder's main node (its S or X node) alone;
                # `has_intent` marks the holder on every node, so that, expired, it still blocks there.
                "intent": {"type": "object", "enabled": False},
                "checkpoint": {"type": "object", "enabled": False},
                "recovery": {"type": "object", "enabled": False},
                "has_intent": {"type": "boolean"},
            },
        },
        # Markers of requests that waited (fair waiting); read by scripts only.
        "waiters": {"type": "object", "enabled": False},
        # When the latest marker written here expires: finds the nodes with waiters (deadlock detection).
        "waiting_until": {"type": "date", "format": "epoch_millis"},
    },
}

ADDED_SINCE_VERSION_1 = ("waiting_until",)
"""Fields a lock index of mapping version 1 lacks; setup adds them (adding a field is allowed on a live index)."""
ADDED_SINCE_VERSION_2 = ("holders.has_intent", "holders.owner.pidns")
"""Fields a lock index of mapping version 2 lacks (setup adds them too)."""
UPGRADE_PROPERTIES: dict[str, Any] = {
    "waiting_until": MAPPING["properties"]["waiting_until"],
    "holders": {
        "type": "nested",
        "properties": {
            "has_intent": MAPPING["properties"]["holders"]["properties"]["has_intent"],
            "owner": {"properties": {"pidns": _OWNER["properties"]["pidns"]}},
        },
    },
}
"""What setup puts into the mapping of an existing lock index: every field added since version 1 (a no-op when
the index has them)."""
PROPERTIES_OF_VERSION_2: dict[str, Any] = {
    **MAPPING["properties"],
    "holders": {
        **MAPPING["properties"]["holders"],
        "properties": {
            **{k: v for k, v in MAPPING["properties"]["holders"]["properties"].items() if k != "has_intent"},
            "owner": {"properties": {k: v for k, v in _OWNER["properties"].items() if k != "pidns"}},
        },
    },
}
PROPERTIES_OF_VERSION_1 = {k: v for k, v in PROPERTIES_OF_VERSION_2.items() if k not in ADDED_SINCE_VERSION_1}

NESTED_OBJECTS_LIMIT = 10_000
"""Elasticsearch's default ``index.mapping.nested_objects.limit``: the most nested objects (here: holders) one
document may have; a write past it is refused with a 400."""

HTTP_MAX_CONTENT_LENGTH = 100 * 1024 * 1024
"""Elasticsearch's default ``http.max_content_length`` (100mb): a larger request body is refused (413)."""

# One primary shard: every write of a request lands on one shard, in order, and
# its `_seq_no` (with the primary term, our fencing token) is one sequence for the whole lock index.
INDEX_SETTINGS: dict[str, Any] = {"number_of_shards": 1}

DEFAULT_REPLICAS = "0-2"
"""A copy of the lock index on every node up to three (``auto_expand_replicas``): 2 replicas on a cluster of
three or more, 1 on two nodes, none on a single development node (which stays green)."""

WRITE_TIMEOUT_CAP = 5.0
"""Longest wait, in seconds, of one lock write for its shard copies to be active (the ``_bulk`` ``timeout``).
Elasticsearch's default is a minute; past this the store answers 503, which reads as busy and is retried
within the caller's own deadline or lease."""

_AUTO_EXPAND = re.compile(r"^\d+-(\d+|all)$")

RETRY_ON_CONFLICT = 10
"""A real cluster answers 409 to concurrent updates of one node; retry on the shard."""

STALE_MARGIN_S = 2
"""Seconds past ``grace`` after which the reaper deletes a node of expired holders outright, without EVICT.

The search's ``now`` is the clock of the node that coordinates it, not of
the primary shard that stamped the lease: the margin absorbs skew between
the two (and the rounding of ``grace`` to seconds).
"""

SOLE_HOLDS_KEPT = 10_000
"""Holders whose conditional-delete facts (:meth:`ElasticsearchLockBackend._sole`) a backend keeps, at most."""

BUSY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers that mean "not now": rejected executions and circuit breakers (429), an unavailable shard or a
proxy in trouble (502-504). They decide nothing, so the request may be sent again."""

BUSY_BACKOFF_CAP = 1.0
"""Longest sleep between two tries of a busy store, in seconds."""

UNDER_REPLICATED = "under_replicated"
"""The error type given to a write the cluster applied on fewer copies than ``wait_for_active_shards`` asked."""

RELEASE_TOMBSTONE_MS = 60_000
"""How long a node that outlives a release keeps its tombstone (see :func:`_released_here`): longer than a
request can be re-executed after it was applied (the write timeout, a new primary, the client's resends)."""

RELEASE_TOMBSTONES_KEPT = 16
"""Release tombstones one node keeps at most, the newest: a hot shared node is not left to grow."""

MARKER_TTL_RTTS = 8
"""A waiting marker lasts at least this many acquire answers (see ``_marker_ttl_ms``)."""

RTT_SMOOTHING = 0.2
"""Weight of the latest acquire's answer time in the smoothed one."""

QUIET_RELEASE_RETRY = 1.0
"""Seconds an acquire that failed keeps trying to give back what it took; the lease ends the rest."""

_LOST_ANSWER = (elasticsearch.ConnectionError, elasticsearch.ConnectionTimeout)
"""Failures after which the request may or may not have been applied: resent to another host."""

_SORT = [{"namespace": "asc"}, {"kind": "asc"}, {"key": "asc"}]
_CLIENT_OPTIONS = frozenset(inspect.signature(elasticsearch.Elasticsearch.__init__).parameters) - {"self", "hosts"}


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


def _holds(source: Mapping[str, Any] | None, holder_id: str) -> bool:
    return any(holder.get("id") == holder_id for holder in (source or {}).get("holders") or ())


def _marks(source: Mapping[str, Any] | None, holder_id: str) -> bool:
    """Return True if ``source`` keeps a waiting marker of request ``holder_id``."""
    return any(waiter.get("id") == holder_id for waiter in (source or {}).get("waiters") or ())


def _queued_before(source: Mapping[str, Any] | None, ticket: int, mode: modes.Mode) -> int:
    """Count the waiting markers in ``source`` that queue before a request of ``ticket`` for ``mode``."""
    conflicts = {m.value for m in modes.conflicting(mode)}
    return sum(
        1
        for w in (source or {}).get("waiters") or ()
        if w.get("ticket") is not None and w["ticket"] < ticket and w.get("mode") in conflicts
    )


def read_acquire_items(
    request: LockRequest,
    items: Sequence[Mapping[str, Any]],
    targets: Sequence[tuple[Node, modes.Mode]] | None = None,
    *,
    max_holders: int | None = None,
) -> AcquireOutcome:
    """Sort the items of an acquire ``_bulk`` (of ``targets``, default all the request's) into taken, refused, failed.

    ``created``/``updated`` took the node, except an update with neither a
    holder nor a marker of the request: a reentry (ACQUIRE writes such a node
    back unchanged). ``noop`` is a refusal. A 409 (concurrent
    update or two upserts racing to create the node, after retry_on_conflict)
    wrote nothing: a refusal to retry, never a grant; a busy store's answer
    (429, 503) is neither, and goes to ``busy``. The token is the
    highest ``(_primary_term, _seq_no)`` written, as :func:`_token`: it exceeds
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
                outcome.busy.append(f"{node}: {error.get('type')}: {error.get('reason')}")
            elif body.get("status") == 409 or error.get("type") == "version_conflict_engine_exception":
                outcome.refused.append(node)
            else:
                outcome.errors.append(f"{node}: {error.get('type')}: {error.get('reason')}")
            continue
        result = body.get("result")
        source = body.get("get", {}).get("_source")
        if (
            result == "updated"
            and request.may_reenter(node)
            and not _holds(source, request.holder_id)
            and not _marks(source, request.holder_id)
        ):
            outcome.token = max(outcome.token, _token(body))  # reentered: written back unchanged (see ACQUIRE)
        elif result in ("created", "updated") and request.ticket is not None and not _holds(source, request.holder_id):
            outcome.refused.append(node)  # it left a waiting marker, not a holder
            outcome.ahead = max(outcome.ahead, _queued_before(source, request.ticket, mode))
            _note_full(outcome, node, source, max_holders)
        elif result in ("created", "updated"):
            outcome.taken.append(node)
            outcome.token = max(outcome.token, _token(body))
        elif result == "noop":
            outcome.refused.append(node)
            if request.ticket is not None:
                outcome.ahead = max(outcome.ahead, _queued_before(source, request.ticket, mode))
            _note_full(outcome, node, source, max_holders)
        else:
            outcome.errors.append(f"{node}: unexpected result {result!r}")
    return outcome


def _note_full(outcome: AcquireOutcome, node: Node, source: Mapping[str, Any] | None, max_holders: int | None) -> None:
    count = (source or {}).get("lock_count") or 0
    if max_holders is not None and count >= max_holders:
        outcome.full.append((node, count))


TOKEN_TERM_SHIFT = 40
"""Bits of a fencing token below the primary term: the ``_seq_no`` part (see :func:`_token`)."""

INCARNATION_MARK = ".floor-"
"""A lock index is an alias of one concrete index named ``<alias>.floor-<token floor>`` (see :func:`incarnation`)."""


def incarnation(alias: str, floor: int) -> str:
    """Return the name of the concrete lock index behind ``alias`` whose tokens all exceed ``floor``."""
    return f"{alias}{INCARNATION_MARK}{floor}"


def token_floor_of(index: str) -> int:
    """Return the token floor of concrete lock index ``index`` (0 for an index not named by :func:`incarnation`)."""
    _, mark, digits = index.rpartition(INCARNATION_MARK)
    return int(digits) if mark and digits.isdigit() else 0


def _token(body: Mapping[str, Any]) -> int:
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


def _written_token(body: Mapping[str, Any]) -> int | None:
    """Return the token position of a write that reached its shard (None for a no-op or a failure)."""
    seq_no, term = body.get("_seq_no"), body.get("_primary_term")
    if not isinstance(seq_no, int) or not isinstance(term, int) or seq_no < 0 or term < 1:
        return None
    return _token(body)


def _merge(first: AcquireOutcome, second: AcquireOutcome) -> AcquireOutcome:
    return AcquireOutcome(
        first.taken + second.taken,
        first.refused + second.refused,
        first.errors + second.errors,
        max(first.token, second.token),
        first.busy + second.busy,
        max(first.ahead, second.ahead),
        first.full + second.full,
    )


def _result(item: Mapping[str, Any]) -> str | None:
    return next(iter(item.values())).get("result")


def _markers(source: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Return the waiting markers of a node's ``source``: its ``waiters`` but the release tombstones."""
    return [w for w in source.get("waiters") or () if not w.get("released")]


def _released_here(source: Mapping[str, Any], holder_id: str, owner_key: str | None) -> bool:
    """Return True if ``source`` keeps the tombstone of ``holder_id`` released by ``owner_key`` (RELEASE wrote it).

    Only a RELEASE that removed that holder with that owner key writes it, in
    the same write: its presence proves the release was done, by that owner,
    not an eviction, a reaper's take-over or a forced release (whose
    tombstone's ``by`` is null).
    """
    return any(
        w.get("released") and w.get("id") == holder_id and w.get("by") == owner_key for w in source.get("waiters") or ()
    )


def _busy(item: Mapping[str, Any]) -> bool:
    return next(iter(item.values())).get("status") in BUSY_STATUSES


def _under_replicated(item: dict[str, Any], required: int | None) -> dict[str, Any]:
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


def index_of_namespace(namespace: str, index: str, index_count: int, namespace_indices: Mapping[str, str]) -> str:
    """Return the lock index of ``namespace``: named in ``namespace_indices``, else hashed into ``index_count``.

    The hash (SHA-256 of the name) is stable across processes and versions;
    with one index it is always ``index`` itself.
    """
    named = namespace_indices.get(namespace)
    if named is not None:
        return named
    if index_count == 1:
        return index
    bucket = int.from_bytes(hashlib.sha256(namespace.encode()).digest()[:8], "big") % index_count
    return f"{index}-{bucket}"


def _copies(replicas: int | str, data_nodes: int) -> int:
    """Return how many copies of a lock index ``replicas`` keeps on a cluster of ``data_nodes`` data nodes."""
    if isinstance(replicas, int):
        return 1 + replicas
    low, high = replicas.split("-")
    most = data_nodes - 1 if high == "all" else int(high)
    return 1 + max(int(low), min(most, data_nodes - 1))


def _item_lines(operations: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split ``_bulk`` lines into one list per item: an action line, and its body unless it deletes."""
    items: list[list[dict[str, Any]]] = []
    lines = iter(operations)
    for action in lines:
        items.append([action] if "delete" in action else [action, next(lines)])
    return items


_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def byte_size(value: Any) -> int | None:
    """Return an Elasticsearch byte size setting (``100mb``, ``1gb``, ``512``) in bytes; None if unreadable."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)b?", str(value).strip().lower())
    if match is None:
        return None
    return int(float(match.group(1)) * _BYTE_UNITS[match.group(2)])


def _encode_cursor(sort_values: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(sort_values).encode()).decode()


def _decode_cursor(cursor: str) -> list[Any]:
    try:
        return json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except ValueError as e:
        raise ValueError(f"not a holder page cursor: {cursor!r}") from e


def _records(source: Mapping[str, Any], holders: Sequence[Mapping[str, Any]] | None = None) -> list[HolderRecord]:
    node = Node(source["namespace"], Kind(source["kind"]), source["key"])
    records = []
    for h in source.get("holders") or [] if holders is None else holders:
        mode = modes.Mode(h["mode"])
        main = modes.is_grant(mode)  # an older release copied intent and checkpoint onto every node
        records.append(
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
            )
        )
    return records


def _awaits_recovery(holder: Mapping[str, Any]) -> bool:
    """Whether a holder entry carries an intent, here or on its main node: expired, it still blocks."""
    return bool(holder.get("intent") or holder.get("has_intent"))


def _evictable(holder: Mapping[str, Any]) -> bool:
    return not _awaits_recovery(holder)


MARKER_OWNER_FIELDS = ("host", "pid", "thread_name")
"""What a waiting marker records of its owner beside the key: what people read (``deadlock.owner_label``)."""


def _marker_fields(request: LockRequest) -> dict[str, Any]:
    """Return the owner fields a waiting marker of ``request`` records, flat (see ACQUIRE)."""
    owner = request.owner.as_dict()
    fields = {name: owner[name] for name in MARKER_OWNER_FIELDS}
    if request.holds_others:
        fields["owner"] = request.owner.key
    return fields


def _marker_owner(marker: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return who waits, as a marker records it: the owner's key (when it held other locks) and labels."""
    owner = marker.get("owner")
    if isinstance(owner, Mapping):  # a marker of an earlier release: the owner's fields
        return owner
    fields = {name: marker[name] for name in MARKER_OWNER_FIELDS if name in marker}
    return {**fields, "key": owner} if owner else fields


def _wait_state(sources: Sequence[Mapping[str, Any]], now_ms: int) -> WaitState:
    """The live markers of node documents and the holders that block there (live, or awaiting recovery)."""
    waiters: list[WaiterRecord] = []
    holders: list[HolderRecord] = []
    for source in sources:
        live = [w for w in _markers(source) if w.get("expires_at", 0) > now_ms]
        if not live:
            continue
        node = Node(source["namespace"], Kind(source["kind"]), source["key"])
        for w in live:
            expires_at = from_epoch_ms(w["expires_at"])
            assert expires_at is not None
            owner = _marker_owner(w)
            waiters.append(WaiterRecord(node, modes.Mode(w["mode"]), w["id"], owner, w["ticket"], expires_at))
        blocking = [h for h in source.get("holders") or () if h["expires_at"] > now_ms or _awaits_recovery(h)]
        holders.extend(_records(source, blocking))
    return WaitState(tuple(waiters), tuple(holders))


def _holder(holder: Mapping[str, Any], mode: modes.Mode, request: LockRequest) -> dict[str, Any]:
    """Return the holder entry a request writes on a node it takes in ``mode``: the intent on its main node only.

    Its other nodes (the IS/IX ancestors of a tree lock) carry ``has_intent``
    (in ``holder``) instead: they are shared, and every other holder's write
    there rewrites every entry.
    """
    entry = {**holder, "mode": mode.value}
    if request.intent is not None and modes.is_grant(mode):
        entry["intent"] = request.intent
    return entry


def _node_fields(node: Node) -> dict[str, Any]:
    """Return the source fields that name ``node``."""
    tree = node.kind is Kind.TREE
    return {
        "namespace": node.namespace,
        "kind": node.kind.value,
        "key": node.key,
        "parent": paths.parent(node.key) if tree else None,
        "depth": node.key.count("/") if tree else 0,
    }


def _expired_query(grace: float, margin: int = 0) -> dict[str, Any]:
    """Match holders expired for at least ``grace`` (plus ``margin``) seconds, by the store's clock (``now``).

    Date math has no millisecond unit, so the grace is cut to whole seconds:
    the query may match a little early, and the EVICT script, which compares
    ``ctx._now`` to the millisecond, has the last word.
    """
    seconds = math.floor(max(0.0, grace)) + margin
    return {"range": {"holders.expires_at": {"lte": f"now-{seconds}s" if seconds else "now"}}}


def _hit_records(hit: Mapping[str, Any], keep: Callable[[Mapping[str, Any]], bool] | None = None) -> list[HolderRecord]:
    """Return the records of the holders ``hit`` matched (its inner hits "match"), those ``keep`` accepts."""
    inner = hit.get("inner_hits", {}).get("match")
    holders = [h["_source"] for h in inner["hits"]["hits"]] if inner else []
    return _records(hit["_source"], [h for h in holders if keep is None or keep(h)])


def _body(response: Any) -> dict[str, Any]:
    """Return a client response as a plain dict."""
    return dict(getattr(response, "body", response) or {})


def _version(info: Mapping[str, Any]) -> tuple[int, int]:
    """Return (major, minor) of the cluster's version from its root answer ((0, 0) if unreadable)."""
    number = str((info.get("version") or {}).get("number") or "")
    parts = number.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return 0, 0


def _error_type(error: LockBackendUnavailable) -> str | None:
    """Return the Elasticsearch error type behind ``error`` (``index_not_found_exception``, ...), if any."""
    cause = error.__cause__
    return getattr(cause, "error", None) if isinstance(cause, elasticsearch.ApiError) else None


def _is_lock_mapping(mappings: Mapping[str, Any]) -> bool:
    """Return whether ``mappings`` are django-esdlock's (of any version): its ``_meta`` says so."""
    return "django_esdlock" in (mappings.get("_meta") or {})


def _auto_created(mappings: Mapping[str, Any]) -> bool:
    """Return whether ``mappings`` are those of an index a lock write created by itself (dynamic, lock fields)."""
    dynamic = mappings.get("dynamic", True) in (True, "true")
    return dynamic and set(mappings.get("properties") or {}) <= set(MAPPING["properties"])


def _add_alias(index: str, alias: str) -> dict[str, Any]:
    """The alias action that makes ``index`` the one index ``alias`` writes to (refused if another one is)."""
    return {"add": {"index": index, "alias": alias, "is_write_index": True}}


@dataclasses.dataclass(frozen=True)
class _Api:
    """A client call to make: ``client.<name>(**kwargs)``, the name dotted for namespaces (``indices.create``)."""

    name: str
    kwargs: dict[str, Any]
    options: dict[str, Any] | None = None
    """For ``client.options(...)`` first (``ignore_status``)."""


@dataclasses.dataclass(frozen=True)
class _Pause:
    seconds: float


Steps = Generator[_Api | _Pause, Any, T]
"""What the backend's logic is written as: it yields the calls and pauses it needs and is sent their results
(or thrown their errors), so that one copy of it runs on the blocking client (:meth:`_run`) and on the
async one (:meth:`_arun`)."""


CREDENTIAL_OPTIONS = ("basic_auth", "api_key", "bearer_auth", "http_auth")
"""Client options that send credentials with every request."""

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _flag(name: str, value: Any) -> bool:
    """Return OPTIONS[name] as a bool: True/False, or a URL query's "true"/"1"/"false"/"0"."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise InvalidLockBackend(f"ElasticsearchLockBackend OPTIONS[{name!r}] must be true or false, not {value!r}")


def host_label(host: Any) -> str:
    """Return ``host`` (a URL, a ``{"scheme", "host", "port"}`` mapping or a NodeConfig) as a redacted URL."""
    if isinstance(host, str):
        return redact(host)
    if isinstance(host, Mapping):
        scheme, name, port = host.get("scheme", "?"), host.get("host", "?"), host.get("port")
    else:
        scheme, name, port = getattr(host, "scheme", "?"), getattr(host, "host", "?"), getattr(host, "port", None)
    return redact(f"{scheme}://{name}" + (f":{port}" if port else ""))


def _scheme_and_credentials(host: Any) -> tuple[str, bool]:
    """Return the scheme of ``host`` and whether it carries credentials of its own (user info, a header)."""
    if isinstance(host, str):
        try:
            parts = urllib.parse.urlsplit(host)
            return parts.scheme.lower(), bool(parts.username or parts.password)
        except ValueError:
            return "", False
    if isinstance(host, Mapping):
        return str(host.get("scheme", "")).lower(), False
    headers = getattr(host, "headers", None) or {}
    return str(getattr(host, "scheme", "")).lower(), any(str(k).lower() == "authorization" for k in headers)


def _header_credentials(headers: Any) -> list[str]:
    """Return the values of Authorization headers in ``headers`` and the credentials they carry."""
    found = []
    for key, value in headers.items() if isinstance(headers, Mapping) else ():
        if str(key).lower() == "authorization" and isinstance(value, str):
            found.extend([value, value.split(None, 1)[-1]])
    return found


def configured_secrets(hosts: Sequence[Any], client_options: Mapping[str, Any]) -> list[str]:
    """Return every secret value in the hosts and client options: what redaction must mask."""
    found: list[str] = []
    for host in hosts:
        if isinstance(host, str):
            found.extend(url_secrets(host))
        else:
            found.extend(_header_credentials(getattr(host, "headers", None)))
    for name in CREDENTIAL_OPTIONS:
        found.extend(credential_values(client_options.get(name)))
    found.extend(_header_credentials(client_options.get("headers")))
    return found


def plain_http_credentials(hosts: Sequence[Any], client_options: Mapping[str, Any]) -> list[str]:
    """Return the (redacted) hosts to which credentials would travel over plain http, unencrypted.

    Credentials are user info in a host URL, a client credential option
    (``basic_auth``, ``api_key``, ``bearer_auth``, ``http_auth``) or an
    Authorization header; the options' ones go to every host. ``cloud_id``
    is always https.
    """
    everywhere = any(client_options.get(name) not in (None, "") for name in CREDENTIAL_OPTIONS) or bool(
        _header_credentials(client_options.get("headers"))
    )
    plain = []
    for host in hosts:
        scheme, own = _scheme_and_credentials(host)
        if scheme != "https" and (own or everywhere):
            plain.append(host_label(host))
    return plain


def _bounded(api: _Api, action: str, deadline: float | None, share: float = 1.0) -> _Api:
    """Return ``api`` with the client's ``request_timeout`` set to ``share`` of what is left before ``deadline``."""
    if deadline is None:
        return api
    left = deadline - time.monotonic()
    if left <= 0:
        raise LockBackendUnavailable(f"Elasticsearch had no time left to {action}: the lease it serves runs out")
    return dataclasses.replace(api, options={**(api.options or {}), "request_timeout": left * share})


def _renewed_or_busy(outcomes: Sequence[tuple[bool | None, str]]) -> bool:
    """The outcome of renewing one grant: raise LockStoreBusy if the store turned it away for now."""
    ((renewed, busy),) = outcomes
    if renewed is None:
        raise LockStoreBusy(f"Elasticsearch was too busy to renew: {busy}")
    return renewed


def _perform(client: Any, api: _Api) -> Any:
    if api.options:
        client = client.options(**api.options)
    for name in api.name.split("."):
        client = getattr(client, name)
    return client(**api.kwargs)


class ElasticsearchLockBackend(BaseLockBackend):
    """Locks as documents of one Elasticsearch index, as the chapter builds them.

    OPTIONS: ``hosts`` (default ``["http://127.0.0.1:9200"]``), ``index``
    (default ``"locks"``), ``number_of_replicas`` (an int, or an
    ``auto_expand_replicas`` range; default ``"0-2"``),
    ``wait_for_active_shards`` (an int, ``"all"``, or ``"auto"``: a majority
    of the copies the lock index has on the cluster; the default),
    ``index_count`` (hash namespaces into that many lock indices; default 1),
    ``namespace_indices`` (namespace -> lock index, ahead of the hash),
    ``max_holders_per_node`` (the most holders one lock node keeps; a node
    that keeps that many refuses newcomers as a conflict would, until holders
    leave; default 10,000, Elasticsearch's ``index.mapping.nested_objects.limit``),
    ``token_floor`` (every fencing token exceeds it: see "Restoring a lock
    store" in the README; default 0) and any keyword of
    ``elasticsearch.Elasticsearch`` (``basic_auth``, ``api_key``,
    ``ca_certs``, ``verify_certs``, ``request_timeout``, ...), passed through
    to the client.

    Each lock index is an alias of one concrete index,
    ``<index>.floor-<floor>``, whose tokens all exceed its floor; a lost one
    is recreated above every token this process saw (see
    :meth:`_lock_index_steps`).

    Credentials (user info in a host, ``basic_auth``, ``api_key``,
    ``bearer_auth``, an Authorization header) go only to https hosts:
    over plain http they are refused unless ``allow_plain_http_credentials``
    is True (a network you trust). They never appear in ``describe()``, a
    message or a log (see :mod:`django_esdlock.redaction`).
    """

    features = StoreFeatures(
        can_list_waiting=True, can_take_over=True, can_force_release=True, async_native=True, fails_over=True
    )

    lease_margin: float = 0.5
    """A lease is stamped with ``ctx._now``, a clock each node caches and advances every
    ``thread_pool.estimated_time_interval`` (200 ms by default): measured on 7.0, ``ctx._now`` was up to
    196 ms older than the moment the request was sent. 0.5 s covers that interval, the delays of the
    node's timer thread and the holder's own. Raise it with the interval."""

    busy_retry: float = 10.0
    """Seconds a release, a listing or maintenance keeps retrying a busy store, with backoff, before LockStoreBusy.

    Acquire and renew do not retry inside: their callers (the waiting loop, the
    renewer) retry them within the lock's own deadline or lease.
    """

    def __init__(
        self,
        *,
        ttl: float = 30.0,
        hosts: Sequence[str] | str = ("http://127.0.0.1:9200",),
        index: str = "locks",
        number_of_replicas: int | str = DEFAULT_REPLICAS,
        wait_for_active_shards: int | str = "auto",
        index_count: int = 1,
        max_holders_per_node: int = NESTED_OBJECTS_LIMIT,
        namespace_indices: Mapping[str, str] | None = None,
        allow_plain_http_credentials: bool | str = False,
        token_floor: int | str = 0,
        **client_options: Any,
    ) -> None:
        super().__init__(ttl=ttl)
        unknown = set(client_options) - _CLIENT_OPTIONS
        if unknown:
            raise ImproperlyConfigured(
                f"ElasticsearchLockBackend got unknown OPTIONS {', '.join(sorted(unknown))}; "
                "use 'hosts', 'index' or a keyword of elasticsearch.Elasticsearch"
            )
        host_list = [hosts] if isinstance(hosts, str) else list(hosts)
        add_secrets(*configured_secrets(host_list, client_options))
        trusted = _flag("allow_plain_http_credentials", allow_plain_http_credentials)
        plain = plain_http_credentials(host_list, client_options)
        if plain and not trusted:
            raise InvalidLockBackend(
                f"ElasticsearchLockBackend would send credentials over plain http to {', '.join(plain)}: "
                "anyone on the network could read them. Use https: an https:// host in OPTIONS['hosts'], "
                "or elasticsearch+https:// in a LOCK_BACKEND URL. On a network you trust, say so: "
                "OPTIONS['allow_plain_http_credentials'] = True (URL: ?allow_plain_http_credentials=true)."
            )
        namespace_indices = dict(namespace_indices or {})
        for name in (index, *namespace_indices.values()):
            if not isinstance(name, str) or not name or name != name.lower() or name.startswith(("_", "-", "+")):
                raise ImproperlyConfigured(f"ElasticsearchLockBackend OPTIONS: not a valid index name: {name!r}")
        replicas_ok = isinstance(number_of_replicas, int) and number_of_replicas >= 0
        if not (replicas_ok or (isinstance(number_of_replicas, str) and _AUTO_EXPAND.match(number_of_replicas))):
            raise ImproperlyConfigured(
                "ElasticsearchLockBackend OPTIONS['number_of_replicas'] must be an int >= 0 or a range like "
                f"'0-2' or '0-all', not {number_of_replicas!r}"
            )
        if not (
            wait_for_active_shards in ("auto", "all")
            or (type(wait_for_active_shards) is int and wait_for_active_shards >= 1)
        ):
            raise ImproperlyConfigured(
                "ElasticsearchLockBackend OPTIONS['wait_for_active_shards'] must be 'auto', 'all' or an int >= 1, "
                f"not {wait_for_active_shards!r}"
            )
        if type(index_count) is not int or index_count < 1:
            raise ImproperlyConfigured(
                f"ElasticsearchLockBackend OPTIONS['index_count'] must be an int >= 1, not {index_count!r}"
            )
        if isinstance(token_floor, str) and token_floor.strip().isdigit():
            token_floor = int(token_floor)
        if type(token_floor) is not int or not 0 <= token_floor < TOKEN_FLOOR_LIMIT:
            raise ImproperlyConfigured(
                f"ElasticsearchLockBackend OPTIONS['token_floor'] must be an int from 0 to 2**62, not {token_floor!r}"
            )
        self.token_floor = token_floor
        self.hosts = host_list
        self.index = index
        self.number_of_replicas = number_of_replicas
        self.wait_for_active_shards = wait_for_active_shards
        self.index_count = index_count
        self.namespace_indices = namespace_indices
        if type(max_holders_per_node) is not int or max_holders_per_node < 1:
            raise ImproperlyConfigured(
                "ElasticsearchLockBackend OPTIONS['max_holders_per_node'] must be an int >= 1, "
                f"not {max_holders_per_node!r}"
            )
        self.max_holders_per_node = max_holders_per_node
        self.write_timeout = min(WRITE_TIMEOUT_CAP, ttl / 3)
        self._active_shards: int | str | None = None
        """``wait_for_active_shards`` as sent: resolved from "auto" when the lock indices are set up."""
        self.client_options = client_options
        self._index_ready = False
        self._per_item_alias: bool | None = None
        """Whether ``_bulk`` action lines may say ``require_alias`` (Elasticsearch 7.10 and later)."""
        self._current: dict[str, str] = {}
        """lock index (an alias) -> the concrete index this process writes to through it (itself, if legacy)."""
        self._current_high: dict[str, int] = {}
        """lock index -> the highest token position this process saw written in its current concrete index."""
        self._past_high: dict[str, int] = {}
        """lock index -> the highest token position this process saw written in its earlier concrete indices."""
        self._client: elasticsearch.Elasticsearch | None = None
        self._client_pid: int | None = None
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, elasticsearch.AsyncElasticsearch] = (
            weakref.WeakKeyDictionary()
        )
        self._sole: dict[str, dict[str, tuple[int, int, str]]] = {}
        """holder id -> node id -> (seq_no, primary_term, concrete index) of our last write, where it left that
        holder alone."""
        self._sole_lock = ForkSafeLock()
        self._existing: dict[str, None] = {}
        """Ids of nodes lately found existing, oldest first (a hint: a wrong one costs a round trip)."""
        self._blocked: dict[str, tuple[frozenset[str], int]] = {}
        """holder id of a waiting request -> ids of the nodes that refused its last attempt, and its queue place."""
        self._acquire_rtt = 0.0
        """Seconds an acquire takes to answer, smoothed: a waiting marker outlasts a few of them."""
        self._full: dict[str, list[tuple[Node, int]]] = {}
        """holder id -> the nodes that refused its last attempt for keeping max_holders_per_node holders."""

    def describe(self) -> str:
        indices = self.lock_indices
        named = f"index {indices[0]!r}" if len(indices) == 1 else f"indices {', '.join(indices)}"
        return f"Elasticsearch {', '.join(host_label(h) for h in self.hosts)} {named}"

    @property
    def lock_indices(self) -> tuple[str, ...]:
        """Every lock index of this backend: the hashed ones, then those ``namespace_indices`` names."""
        hashed = [self.index] if self.index_count == 1 else [f"{self.index}-{i}" for i in range(self.index_count)]
        return tuple(dict.fromkeys([*hashed, *self.namespace_indices.values()]))

    def index_of(self, namespace: str) -> str:
        """Return the lock index that holds the nodes of ``namespace``."""
        return index_of_namespace(namespace, self.index, self.index_count, self.namespace_indices)

    def _indices_of(self, namespace: str | None) -> str:
        """Return the ``index`` argument of a search: ``namespace``'s lock index, or all of them."""
        return ",".join(self.lock_indices) if namespace is None else self.index_of(namespace)

    def _index_settings(self) -> dict[str, Any]:
        if isinstance(self.number_of_replicas, int):
            return {**INDEX_SETTINGS, "number_of_replicas": self.number_of_replicas, "auto_expand_replicas": False}
        return {**INDEX_SETTINGS, "auto_expand_replicas": self.number_of_replicas}

    @property
    def _required_copies(self) -> int | None:
        """Shard copies a write must have reached to count (None: judge no count, as for ``"all"``)."""
        return self._active_shards if isinstance(self._active_shards, int) else None

    # --- connection -------------------------------------------------------

    @property
    def client(self) -> elasticsearch.Elasticsearch:
        """The client of this process: a forked child opens its own connections."""
        if self._client is None or self._client_pid != os.getpid():
            self._client = elasticsearch.Elasticsearch(self.hosts, **self._transport_options())
            self._client_pid = os.getpid()
        return self._client

    @property
    def aclient(self) -> elasticsearch.AsyncElasticsearch:
        """The async client of the running event loop (one per loop: its connections belong to it)."""
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:
            client = self._aclients[loop] = elasticsearch.AsyncElasticsearch(self.hosts, **self._transport_options())
        return client

    @property
    def resends(self) -> int:
        """How many times a request that met a connection failure or timeout is sent again (OPTIONS
        ``max_retries``; default one more try per host, at least 3)."""
        return int(self.client_options.get("max_retries", max(3, len(self.hosts))))

    def _transport_options(self) -> dict[str, Any]:
        """The client's options: OPTIONS over our defaults for a cluster.

        The transport's node pool marks a host that failed to connect or
        timed out dead for a while and sends the next request to another: so
        a dying node costs a resend, not an error. We resend ourselves
        (:meth:`_call_steps`), not the transport (``max_retries=0`` here),
        because a resent release must know it was resent: its first send may
        have done the work. Every lock write may be sent twice safely (a
        holder is keyed by its id; release and renewal are idempotent). A
        busy node's answer is not resent at once (``retry_on_status=()``):
        we back off instead. Sniffing stays off: it would replace the hosts
        you gave with the addresses the nodes publish.
        """
        defaults = {"retry_on_status": (), "retry_on_timeout": True}
        return {**defaults, **self.client_options, "max_retries": 0}

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._client_pid == os.getpid():
            client.close()
        aclients, self._aclients = self._aclients, weakref.WeakKeyDictionary()
        close_per_loop(aclients, lambda aclient: aclient.close())

    async def aclose(self) -> None:
        """Close the async client of the running loop (the blocking one stays)."""
        client = self._aclients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def _run(self, steps: Steps[T]) -> T:
        """Drive ``steps`` with the blocking client."""
        try:
            step = next(steps)
            while True:
                try:
                    result = _perform(self.client, step) if isinstance(step, _Api) else time.sleep(step.seconds)
                except Exception as e:  # noqa: BLE001 - the steps decide what a failure means
                    step = steps.throw(e)
                else:
                    step = steps.send(result)
        except StopIteration as done:
            return done.value

    async def _arun(self, steps: Steps[T]) -> T:
        """Drive ``steps`` with the async client of the running loop."""
        try:
            step = next(steps)
            while True:
                try:
                    if isinstance(step, _Api):
                        result = await _perform(self.aclient, step)
                    else:
                        result = await asyncio.sleep(step.seconds)
                except Exception as e:  # noqa: BLE001 - the steps decide what a failure means
                    step = steps.throw(e)
                else:
                    step = steps.send(result)
        except StopIteration as done:
            return done.value

    @contextlib.contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """Turn client and transport failures into LockBackendUnavailable (LockStoreBusy for "not now")."""
        try:
            yield
        except (elasticsearch.ApiError, elasticsearch.TransportError) as e:
            busy = isinstance(e, elasticsearch.ApiError) and e.meta.status in BUSY_STATUSES
            error = LockStoreBusy if busy else LockBackendUnavailable
            raise error(f"Elasticsearch failed to {action} ({self.describe()}): {redact(e)}") from e

    def _call_steps(
        self,
        action: str,
        api: _Api,
        *,
        retry_for: float | None = None,
        resent: list[bool] | None = None,
        deadline: float | None = None,
    ) -> Steps[Any]:
        """Make the call ``api``; while the store is busy, retry with backoff for ``retry_for`` seconds.

        The default is :attr:`busy_retry`; 0 tries once. A connection failure
        or timeout is sent again at once, to the next host, :attr:`resends`
        times (appending to ``resent`` each time). Other failures are not
        retried. With ``deadline`` (``time.monotonic()``), every send is given
        the client's ``request_timeout`` of what is left before it, and none
        is made after it; with another host to resend to, the first send
        gets half of it, so a node that hangs (killed, cut off) leaves the
        next host time to answer within the bound.
        """
        busy_until = time.monotonic() + (self.busy_retry if retry_for is None else retry_for)
        resends = 0
        for attempt in itertools.count():
            share = 0.5 if len(self.hosts) > 1 and resends == 0 else 1.0
            try:
                with self._translate(action):
                    return (yield _bounded(api, action, deadline, share))
            except LockStoreBusy:
                delay = backoff_delay(attempt, cap=BUSY_BACKOFF_CAP)
                if time.monotonic() + delay > min(busy_until, math.inf if deadline is None else deadline):
                    raise
                yield _Pause(delay)
            except LockBackendUnavailable as e:
                if not isinstance(e.__cause__, _LOST_ANSWER) or resends >= self.resends:
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                resends += 1
                if resent is not None:
                    resent.append(True)
                logger.info("resending to another node after %s", e.__cause__)
        raise AssertionError("unreachable")  # pragma: no cover

    def _call(self, action: str, api: _Api, *, retry_for: float | None = None) -> Any:
        return self._run(self._call_steps(action, api, retry_for=retry_for))

    def setup(self) -> None:
        """Create each lock index (an alias of one concrete index with the strict mapping) unless it exists."""
        self._run(self._setup_steps())

    def _setup_steps(self) -> Steps[None]:
        if self._active_shards is None:
            self._active_shards = yield from self._active_shards_steps()
        if self._per_item_alias is None:
            info = yield from self._call_steps("read the cluster's version", _Api("info", {}))
            self._per_item_alias = _version(_body(info)) >= (7, 10)
        for alias in self.lock_indices:
            yield from self._lock_index_steps(alias)
        self._index_ready = True

    # --- the lock index: an alias of its incarnation ---------------------------------
    #
    # Every write goes through the alias (with ``require_alias`` where the cluster
    # takes it), and every answer names the concrete index it landed in: an answer
    # from an index that is not the alias's incarnation (an index auto-created by a
    # write after the lock index was deleted, on clusters before 7.10) or a missing
    # alias sends the backend here, and the write is sent again. See the README,
    # "Restoring a lock store".

    def _floor_for(self, alias: str, concrete: str | None) -> int:
        """The token floor ``concrete`` (None: a new index) must have for this process to write to it.

        Every token this process saw in other incarnations of ``alias``, and OPTIONS
        ``token_floor``: a token of ``concrete`` must exceed them.
        """
        with self._sole_lock:
            floor = max(self.token_floor, self._past_high.get(alias, 0))
            if concrete is None or concrete != self._current.get(alias):
                floor = max(floor, self._current_high.get(alias, 0))
            return floor

    def _adopt(self, alias: str, concrete: str) -> None:
        """Write to ``concrete`` through ``alias`` from now on."""
        with self._sole_lock:
            if self._current.get(alias) == concrete:
                return
            if alias in self._current:
                self._past_high[alias] = max(self._past_high.get(alias, 0), self._current_high.get(alias, 0))
            self._current[alias] = concrete
            self._current_high[alias] = 0

    def _forget(self, alias: str, concrete: str) -> None:
        """Stop trusting ``concrete``: it went back (recreated or restored under its name); what it gave is past."""
        with self._sole_lock:
            if self._current.get(alias) == concrete:
                self._past_high[alias] = max(self._past_high.get(alias, 0), self._current_high.get(alias, 0))
                del self._current[alias]
                self._current_high[alias] = 0

    def _misplaced(
        self, action: Mapping[str, Any], item: Mapping[str, Any], sent: Mapping[str, tuple[str, int]]
    ) -> bool:
        """Return True if the ``_bulk`` item of ``action`` did not land in its lock index's incarnation.

        ``sent`` is, per lock index, the concrete index and the highest token
        position this process had seen answered there when the item was sent:
        a write sent after that answer comes later in the index's history,
        so a lower position means the index is not the one it was (deleted and
        created again, or restored from a snapshot, under the same name). An
        answer from another incarnation whose floor this process may accept
        (another process recreated the lock index) is adopted instead.
        """
        ((_, header),) = action.items()
        body = next(iter(item.values()))
        alias, concrete = header["_index"], body.get("_index")
        with self._sole_lock:
            current = self._current.get(alias)
        error = body.get("error")
        if error:
            if isinstance(error, Mapping) and error.get("type") == _NOT_FOUND:
                return True
            # Elasticsearch before 7.10 creates a missing index even for a write that then fails (an update
            # of a document that is not there): the answer comes from that index, named like the alias.
            return concrete == alias and current != alias
        if not isinstance(concrete, str):
            return False
        if concrete != current:
            if concrete == alias or token_floor_of(concrete) < self._floor_for(alias, concrete):
                return True
            self._adopt(alias, concrete)
        written = _written_token(body) if body.get("result") in ("created", "updated", "deleted") else None
        if written is None:
            return False
        sent_to, seen = sent.get(alias, ("", 0))
        if concrete == sent_to and written <= seen:
            logger.warning(
                "lock index %s (%s) went back: a write got token position %d after %d was answered; replacing it",
                alias,
                concrete,
                written,
                seen,
            )
            self._forget(alias, concrete)
            return True
        with self._sole_lock:
            if self._current.get(alias) == concrete:
                self._current_high[alias] = max(self._current_high.get(alias, 0), written)
        return False

    def _lock_index_steps(self, alias: str) -> Steps[None]:
        """Make ``alias`` name a lock index this process may write to, creating or replacing its incarnation.

        Missing: create ``<alias>.floor-<floor>`` with the alias. An index whose
        floor is below what this process must honour (:meth:`_floor_for`), or an
        index named like the alias that a write auto-created, is replaced: the
        alias moves to a new incarnation in one atomic alias change that also
        deletes the old index, so of several processes doing it exactly one
        does. A concrete index named like the alias with the lock mapping (made
        by an earlier release) is used as it is (see check W008).
        """
        for _ in range(INCARNATION_TRIES):
            lookup = _Api("indices.get_mapping", {"index": alias}, options={"ignore_status": 404})
            found = _body((yield from self._call_steps("look up the lock index", lookup)))
            indices = {
                name: v.get("mappings") or {} for name, v in found.items() if isinstance(v, Mapping) and "mappings" in v
            }
            if not indices:
                if (yield from self._create_incarnation_steps(alias)):
                    return
                continue
            if len(indices) > 1:
                raise LockBackendUnavailable(
                    f"Elasticsearch lock index {alias!r} is an alias of several indices ({', '.join(sorted(indices))}) "
                    f"({self.describe()}): it must name exactly one; remove the others from the alias"
                )
            ((concrete, mappings),) = indices.items()
            if not _is_lock_mapping(mappings):
                if concrete == alias and _auto_created(mappings):
                    yield from self._replace_steps(alias, concrete)
                    continue
                raise LockBackendUnavailable(
                    f"Elasticsearch index {concrete!r} is not a lock index ({self.describe()}): "
                    "point OPTIONS['index'] at another name"
                )
            floor = 0 if concrete == alias else token_floor_of(concrete)
            if floor >= self._floor_for(alias, concrete):
                yield from self._upgrade_steps(concrete, mappings)
                self._adopt(alias, concrete)
                return
            yield from self._replace_steps(alias, concrete)
        raise LockBackendUnavailable(
            f"Elasticsearch lock index {alias!r} kept changing while it was being set up ({self.describe()})"
        )

    def _create_incarnation_steps(self, alias: str) -> Steps[bool]:
        """Create the first (or next) incarnation of a missing ``alias``; False if another process got there first."""
        floor = self._floor_for(alias, None)
        name = incarnation(alias, floor)
        body = {"index": name, "settings": self._index_settings(), "mappings": MAPPING}
        create = _Api(
            "indices.create",
            {**body, "aliases": {alias: {"is_write_index": True}}, "wait_for_active_shards": self._active_shards},
        )
        try:
            yield from self._call_steps("create the lock index", create)
        except LockBackendUnavailable as e:
            if _error_type(e) != _ALREADY_EXISTS:
                if _error_type(e) in _TAKEN_BY_OTHERS:
                    return False
                raise
            # Ours by its name, but without the alias (a replacement that did not finish): give it the alias.
            add = _Api("indices.update_aliases", {"actions": [_add_alias(name, alias)]})
            try:
                yield from self._call_steps("name the lock index", add)
            except LockBackendUnavailable as e:
                if _error_type(e) in _TAKEN_BY_OTHERS:
                    return False
                raise
        self._adopt(alias, name)
        with self._sole_lock:
            recreated = self._past_high.get(alias, 0) or self._current_high.get(alias, 0)
        if recreated or floor:
            logger.warning("created lock index %s as %s: every token exceeds %d", alias, name, floor)
        return True

    def _replace_steps(self, alias: str, old: str) -> Steps[None]:
        """Move ``alias`` from concrete index ``old`` to a new incarnation and delete ``old``, atomically.

        The alias change fails if ``old`` is gone (another process replaced it
        first): the new index is then deleted, unless it is the one the alias names.
        """
        floor = self._floor_for(alias, None)
        name = incarnation(alias, floor)
        body = {"index": name, "settings": self._index_settings(), "mappings": MAPPING}
        created = True
        try:
            yield from self._call_steps(
                "create the lock index", _Api("indices.create", {**body, "wait_for_active_shards": self._active_shards})
            )
        except LockBackendUnavailable as e:
            if _error_type(e) != _ALREADY_EXISTS:
                raise
            created = False
        swap = _Api("indices.update_aliases", {"actions": [{"remove_index": {"index": old}}, _add_alias(name, alias)]})
        try:
            yield from self._call_steps("replace the lock index", swap)
        except LockBackendUnavailable as e:
            if _error_type(e) not in _TAKEN_BY_OTHERS:
                raise
            if created:
                lookup = _Api("indices.get_alias", {"name": alias}, options={"ignore_status": 404})
                if name not in _body((yield from self._call_steps("look up the lock index", lookup))):
                    drop = _Api("indices.delete", {"index": name}, options={"ignore_status": 404})
                    yield from self._call_steps("delete an unused lock index", drop)
            return
        logger.warning(
            "replaced lock index %s (%s, tokens not above %d) by %s: every token exceeds %d; holders it kept are lost",
            alias,
            old,
            floor,
            name,
            floor,
        )
        self._adopt(alias, name)

    def _upgrade_steps(self, concrete: str, mappings: Mapping[str, Any]) -> Steps[None]:
        """Add the fields of this release to a lock index of an earlier one (adding fields is allowed live)."""
        version = ((mappings.get("_meta") or {}).get("django_esdlock") or {}).get("mapping_version")
        if isinstance(version, int) and version >= MAPPING_VERSION:
            return
        upgrade = _Api(
            "indices.put_mapping", {"index": concrete, "properties": UPGRADE_PROPERTIES, "meta": MAPPING["_meta"]}
        )
        yield from self._call_steps("add the new fields to the lock index", upgrade)

    def concrete_indices(self) -> dict[str, str]:
        """Return each concrete lock index and the lock index (alias) it serves: the names to back up or delete."""
        found: dict[str, str] = {}
        for alias in self.lock_indices:
            lookup = _Api("indices.get_mapping", {"index": alias}, options={"ignore_status": 404})
            for name, value in _body(self._call("look up the lock index", lookup)).items():
                if isinstance(value, Mapping) and "mappings" in value:
                    found[name] = alias
        return found

    def delete_indices(self) -> None:
        """Delete every lock index with the concrete index behind it (tests and tools): every lock there is lost."""
        for name in self.concrete_indices():
            drop = _Api("indices.delete", {"index": name}, options={"ignore_status": 404})
            self._call("delete the lock index", drop)
        with self._sole_lock:
            self._index_ready = False

    def _active_shards_steps(self) -> Steps[int | str]:
        """Resolve ``wait_for_active_shards``: "auto" is a majority of the copies the cluster's data nodes keep."""
        if self.wait_for_active_shards != "auto":
            return self.wait_for_active_shards
        health = yield from self._call_steps("read the cluster's health", _Api("cluster.health", {}))
        copies = _copies(self.number_of_replicas, max(1, int(health.get("number_of_data_nodes") or 1)))
        return copies // 2 + 1

    def _ensure_index_steps(self) -> Steps[None]:
        # Before the first write: an update would otherwise auto-create the
        # index with a dynamic mapping. Two callers may both set it up: that is safe.
        if not self._index_ready:
            yield from self._setup_steps()

    def _scripted(
        self, node: Node, source: str, params: dict[str, Any], *, fields: list[str] | None = None, **body: Any
    ) -> list[dict[str, Any]]:
        """Return the two ``_bulk`` lines of a scripted update of one node, retried on conflict.

        ``fields`` asks for those source fields back; ``body`` adds to the
        update (``scripted_upsert``, ``upsert``).
        """
        index = self.index_of(node.namespace)
        header: dict[str, Any] = {"_index": index, "_id": node.id, "retry_on_conflict": RETRY_ON_CONFLICT}
        if fields:
            # An object, never a list: a bulk action line takes no arrays (400 for the whole bulk).
            header["_source"] = {"includes": fields}
        script = {"source": scripts.compact(source), "lang": "painless", "params": params}
        return [{"update": header}, {"script": script, **body}]

    def _bulk(
        self, operations: list[dict[str, Any]], action: str, *, retry_for: float | None = None
    ) -> list[dict[str, Any]]:
        return self._run(self._bulk_steps(operations, action, retry_for=retry_for))

    def _bulk_steps(
        self,
        operations: list[dict[str, Any]],
        action: str,
        *,
        retry_for: float | None = None,
        resent: list[bool] | None = None,
        deadline: float | None = None,
    ) -> Steps[list[dict[str, Any]]]:
        """Send ``operations`` in one ``_bulk``; return its items in order.

        While the store is busy, as a whole or for some items, send again what
        it turned away, with backoff, for ``retry_for`` seconds (see
        :meth:`_call`); items still busy then come back as they were answered.
        ``deadline`` bounds every send (see :meth:`_call_steps`).
        Items that did not land in their lock index's incarnation (it was
        deleted or replaced) are sent again once the lock index is settled
        (:meth:`_lock_index_steps`): no answer from elsewhere is returned.
        """
        if not operations:
            return []  # a bulk without a body is a 400
        # Every write knows the lock index's incarnation and whether the cluster takes require_alias.
        yield from self._ensure_index_steps()
        lines = _item_lines(operations)
        items: list[dict[str, Any]] = [{}] * len(lines)
        pending = list(range(len(lines)))
        busy_until = time.monotonic() + (self.busy_retry if retry_for is None else retry_for)
        if self._active_shards is None:
            self._active_shards = yield from self._active_shards_steps()
        repairs = 0
        for attempt in itertools.count():
            write_timeout = self.write_timeout
            if deadline is not None:  # the shard copies' wait must end before the request's
                write_timeout = max(0.001, min(write_timeout, deadline - time.monotonic()))
            durability = {"wait_for_active_shards": self._active_shards, "timeout": f"{round(write_timeout * 1000)}ms"}
            batch = [line for i in pending for line in self._aliased(lines[i])]
            with self._sole_lock:
                sent = {a: (c, self._current_high.get(a, 0)) for a, c in self._current.items()}
            answer = yield from self._call_steps(
                action,
                _Api("bulk", {"operations": batch, **durability}),
                retry_for=max(0.0, busy_until - time.monotonic()),
                resent=resent,
                deadline=deadline,
            )
            answered = answer["items"]
            for i, item in zip(pending, answered, strict=True):
                items[i] = _under_replicated(item, self._required_copies)
            misplaced = [i for i in pending if self._misplaced(lines[i][0], items[i], sent)]
            pending = [i for i in pending if _busy(items[i]) or i in misplaced]
            if misplaced:
                # The lock index is gone or was replaced: settle it, then send those items again.
                if repairs >= INCARNATION_TRIES:
                    where = {next(iter(lines[i][0].values()))["_index"] for i in misplaced}
                    raise LockBackendUnavailable(
                        f"Elasticsearch failed to {action}: lock index {', '.join(sorted(where))} keeps "
                        f"disappearing ({self.describe()})"
                    )
                repairs += 1
                for alias in sorted({next(iter(lines[i][0].values()))["_index"] for i in misplaced}):
                    yield from self._lock_index_steps(alias)
                continue
            delay = backoff_delay(attempt, cap=BUSY_BACKOFF_CAP)
            if not pending or time.monotonic() + delay > min(busy_until, math.inf if deadline is None else deadline):
                return items
            yield _Pause(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _aliased(self, item_lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Return one item's ``_bulk`` lines, its action line saying ``require_alias`` where the cluster takes it.

        Then a write to a lock index that is gone fails (404) instead of
        creating an index with a dynamic mapping. Not for a concrete index of an
        earlier release (named like the lock index): it is no alias.
        """
        verb, header = next(iter(item_lines[0].items()))
        alias = header["_index"]
        with self._sole_lock:
            legacy = self._current.get(alias) == alias
        if not self._per_item_alias or legacy:
            return item_lines
        return [{verb: {**header, "require_alias": True}}, *item_lines[1:]]

    # --- the primitive ------------------------------------------------------

    def acquire(self, request: LockRequest) -> Grant | None:
        return self._run(self._acquire_steps(request))

    async def aacquire(self, request: LockRequest) -> Grant | None:
        return await self._arun(self._acquire_steps(request))

    def _acquire_steps(self, request: LockRequest) -> Steps[Grant | None]:
        """Create the nodes that do not exist (CREATE), then take the others (ACQUIRE), all or nothing.

        Uncontended, every node is fresh and the first ``_bulk`` is the only
        one; its short script is what makes it cheap. A node CREATE finds
        existing (a no-op) goes to ACQUIRE in a second ``_bulk``; nodes this
        backend lately found existing (shared ancestors, contended leaves) go
        to ACQUIRE in the first. A waiting request tries the nodes that refused
        it last time on their own first: while they still refuse, a poll
        writes nothing (its markers are fresh) and takes no ancestor it would
        only give back.
        """
        yield from self._ensure_index_steps()
        holder: dict[str, Any] = {"id": request.holder_id, "owner": request.owner.as_dict()}
        if request.intent is not None:
            holder["has_intent"] = True  # the intent itself goes to the main node alone (see _holder)
        with self._sole_lock:
            blocked, _ = self._blocked.pop(request.holder_id, ((), 0))
            self._full.pop(request.holder_id, None)
        probe = [t for t in request.targets if t[0].id in blocked]
        outcome = AcquireOutcome([], [], [], 0)
        sent = time.monotonic()
        try:
            if probe:
                items = yield from self._bulk_steps(self._acquire_items(probe, holder, request), "acquire", retry_for=0)
                outcome = read_acquire_items(request, items, probe, max_holders=self.max_holders_per_node)
            if not (outcome.refused or outcome.errors or outcome.busy):
                rest = [t for t in request.targets if t not in probe]
                outcome = _merge(outcome, (yield from self._take_steps(rest, holder, request)))
        except LockBackendUnavailable:
            # A bulk may have been applied in part: give back whatever it took.
            nodes = [n for n, _ in request.targets]
            yield from self._release_steps(request.holder_id, request.owner.key, nodes, quiet=True)
            raise
        took = time.monotonic() - sent
        self._acquire_rtt = (
            took if not self._acquire_rtt else self._acquire_rtt + (took - self._acquire_rtt) * RTT_SMOOTHING
        )
        if outcome.errors or outcome.refused or outcome.busy:
            failed = bool(outcome.errors or outcome.busy)
            # A busy item may have been written all the same (to too few shard copies): give back every node.
            given_back = [n for n, _ in request.targets] if outcome.busy else outcome.taken
            yield from self._release_steps(request.holder_id, request.owner.key, given_back, quiet=failed)
            if outcome.errors:
                raise LockBackendUnavailable(f"Elasticsearch refused the acquire: {'; '.join(outcome.errors)}")
            if not outcome.refused:
                raise LockStoreBusy(f"Elasticsearch was too busy to acquire: {'; '.join(outcome.busy)}")
            if request.ticket is not None:
                self._note_blocked(request.holder_id, outcome.refused, outcome.ahead)
            if outcome.full:
                self._note_full(request.holder_id, outcome.full)
            return None
        return Grant(request=request, token=outcome.token, taken=tuple(outcome.taken))

    def _take_steps(
        self, targets: Sequence[tuple[Node, modes.Mode]], holder: dict[str, Any], request: LockRequest
    ) -> Steps[AcquireOutcome]:
        """Take ``targets``: CREATE where the node may be new, ACQUIRE where it exists; stop at the first refusal."""
        with self._sole_lock:
            known = [t for t in targets if t[0].id in self._existing]
        fresh = [t for t in targets if t not in known]
        operations = [op for node, mode in fresh for op in self._create_item(node, mode, holder, request)]
        operations += self._acquire_items(known, holder, request)
        items = yield from self._bulk_steps(operations, "acquire", retry_for=0)
        fresh_items, known_items = items[: len(fresh)], items[len(fresh) :]
        existing = [t for t, i in zip(fresh, fresh_items, strict=True) if _result(i) == "noop"]
        created = [(t, i) for t, i in zip(fresh, fresh_items, strict=True) if _result(i) != "noop"]
        self._note_sole(request.holder_id, [(node, item) for (node, _), item in created])
        self._note_existing(
            [n for n, _ in existing],
            [n for (n, _), i in zip(known, known_items, strict=True) if _result(i) == "created"],
        )
        read = created + list(zip(known, known_items, strict=True))
        outcome = read_acquire_items(
            request, [i for _, i in read], [t for t, _ in read], max_holders=self.max_holders_per_node
        )
        if existing and not (outcome.refused or outcome.errors or outcome.busy):
            items = yield from self._bulk_steps(self._acquire_items(existing, holder, request), "acquire", retry_for=0)
            outcome = _merge(
                outcome, read_acquire_items(request, items, existing, max_holders=self.max_holders_per_node)
            )
        elif existing:
            outcome.refused.extend(node for node, _ in existing)  # not tried: the request failed already
        return outcome

    def _acquire_items(
        self, batch: Sequence[tuple[Node, modes.Mode]], holder: dict[str, Any], request: LockRequest
    ) -> list[dict[str, Any]]:
        """Return the ``_bulk`` lines of ACQUIRE for ``batch``, asking for the holders back where they are read."""
        fields = ["lock_count"]  # a refusal by a full node is told apart (see refusal_reason)
        if request.reentrant or request.ticket is not None:  # its holder or marker (see read_acquire_items)
            fields += ["holders.id", "waiters.id"]
        if request.ticket is not None:  # its place in the queues (see queued_poll_interval)
            fields += ["waiters.ticket", "waiters.mode"]
        return [
            op
            for node, mode in batch
            for op in self._scripted(
                node,
                scripts.ACQUIRE,
                self._acquire_params(node, mode, holder, request),
                fields=fields,
                scripted_upsert=True,
                upsert={},
            )
        ]

    def _create_item(
        self, node: Node, mode: modes.Mode, holder: dict[str, Any], request: LockRequest
    ) -> list[dict[str, Any]]:
        """Return the bulk lines of CREATE: the new node's whole source, but the lease, comes from here."""
        fresh = {
            **_node_fields(node),
            "lock_type": "exclusive" if mode is modes.Mode.X else "shared",
            "lock_count": 1,
            "modes": [mode.value],
        }
        params = {"holder": _holder(holder, mode, request), "ttl_ms": request.ttl_ms, "fresh": fresh}
        fields = ["holders.id"] if request.ticket is not None else None
        return self._scripted(node, scripts.CREATE, params, fields=fields, scripted_upsert=True, upsert={})

    def _acquire_params(
        self, node: Node, mode: modes.Mode, holder: dict[str, Any], request: LockRequest
    ) -> dict[str, Any]:
        params = {
            "holder": _holder(holder, mode, request),
            "conflicts": sorted(m.value for m in modes.conflicting(mode)),
            "reentrant": request.may_reenter(node),
            "ticket": request.ticket,
            "marker_ttl_ms": self._marker_ttl_ms(),
            "ttl_ms": request.ttl_ms,
            "node": _node_fields(node),
            "max_holders": self.max_holders_per_node,
        }
        if request.ticket is not None:  # only a request that may wait leaves a marker
            params["waiter"] = _marker_fields(request)
        return params

    # --- conditional deletes ----------------------------------------------------

    def _note_sole(self, holder_id: str, written: Sequence[tuple[Node, Mapping[str, Any]]]) -> None:
        """Remember the nodes ``holder_id`` just created: it is their only holder, as of that write.

        Release then deletes such a node outright, conditional on its
        ``_seq_no`` (no script runs); any later write to the node makes the
        delete fail with 409, and the scripted release takes over.
        """
        versions = {}
        for node, item in written:
            body = next(iter(item.values()))
            if body.get("result") == "created":
                versions[node.id] = (body["_seq_no"], body["_primary_term"], body["_index"])
        if not versions:
            return
        with self._sole_lock:
            self._sole.setdefault(holder_id, {}).update(versions)
            while len(self._sole) > SOLE_HOLDS_KEPT:
                del self._sole[next(iter(self._sole))]  # the oldest: it is only a shortcut

    def _renewed_sole(self, holder_id: str, nodes: Sequence[Node], items: Sequence[Mapping[str, Any]]) -> None:
        """Move the conditional-delete facts of ``holder_id`` to its renewal's writes, where still alone."""
        with self._sole_lock:
            versions = self._sole.get(holder_id)
            if versions is None:
                return
            for node, item in zip(nodes, items, strict=True):
                body = item["update"]
                source = body.get("get", {}).get("_source") or {}
                holder_ids = [h.get("id") for h in source.get("holders") or ()]
                if body.get("result") == "updated" and holder_ids == [holder_id] and not _markers(source):
                    versions[node.id] = (body["_seq_no"], body["_primary_term"], body["_index"])
                else:
                    versions.pop(node.id, None)

    def _note_existing(self, found: Sequence[Node], gone: Sequence[Node]) -> None:
        """Remember which nodes exist (found) or not (gone, deleted): only which script acquire sends first."""
        if not found and not gone:
            return
        with self._sole_lock:
            for node in gone:
                self._existing.pop(node.id, None)
            for node in found:
                self._existing[node.id] = None
            while len(self._existing) > SOLE_HOLDS_KEPT:
                del self._existing[next(iter(self._existing))]

    def _note_blocked(self, holder_id: str, refused: Sequence[Node], ahead: int) -> None:
        """Remember what refused a waiting request (its next attempt tries those nodes first, alone) and its place."""
        with self._sole_lock:
            self._blocked[holder_id] = (frozenset(node.id for node in refused), ahead)
            while len(self._blocked) > SOLE_HOLDS_KEPT:
                del self._blocked[next(iter(self._blocked))]

    def _note_full(self, holder_id: str, full: list[tuple[Node, int]]) -> None:
        with self._sole_lock:
            self._full[holder_id] = full
            while len(self._full) > SOLE_HOLDS_KEPT:
                del self._full[next(iter(self._full))]

    def refusal_reason(self, request: LockRequest) -> str | None:
        with self._sole_lock:
            full = self._full.pop(request.holder_id, None)
        if not full:
            return None
        node, count = full[0]
        return (
            f"was refused by {node}: it keeps {count:,} holders, the most one lock node may keep "
            f"(OPTIONS['max_holders_per_node'] is {self.max_holders_per_node:,}); it takes more as holders leave"
        )

    def queued_poll_interval(self, request: LockRequest) -> float:
        """The head of a queue polls every ``queued_poll_cap``; each request before this one doubles its pause."""
        with self._sole_lock:
            _, ahead = self._blocked.get(request.holder_id, ((), 0))
        return min(self._marker_ttl_ms() / 3000, self.queued_poll_cap * 2 ** min(ahead, 16))

    def _marker_ttl_ms(self) -> int:
        """The lease of a waiting marker: :attr:`marker_ttl`, or longer while the store is slow to answer.

        A poll renews its marker once half of it is gone (see ACQUIRE): with a
        lease of a few answers, a store that answers slowly is not polled with
        a write each time (the writes of a busy node's markers would slow it
        further, until every poll writes).
        """
        return max(self.marker_ttl_ms, round(MARKER_TTL_RTTS * self._acquire_rtt * 1000))

    def _forget_sole(self, holder_id: str) -> dict[str, tuple[int, int]]:
        """Return the conditional-delete facts of ``holder_id`` that are of the current incarnations, and forget all.

        A ``_seq_no`` means nothing in another concrete index: the numbers start over.
        """
        with self._sole_lock:
            facts = self._sole.pop(holder_id, {})
            current = set(self._current.values())
        return {node_id: (seq_no, term) for node_id, (seq_no, term, index) in facts.items() if index in current}

    def withdraw(self, request: LockRequest) -> None:
        self._run(self._withdraw_steps(request))

    async def awithdraw(self, request: LockRequest) -> None:
        await self._arun(self._withdraw_steps(request))

    def _withdraw_steps(self, request: LockRequest) -> Steps[None]:
        with self._sole_lock:
            self._blocked.pop(request.holder_id, None)
            self._full.pop(request.holder_id, None)
        params = {"holder_id": request.holder_id}
        operations = [op for node, _ in request.targets for op in self._scripted(node, scripts.WITHDRAW, params)]
        yield from self._bulk_steps(operations, "withdraw waiting markers")

    def release(self, grant: Grant) -> bool:
        return self._run(self._release_steps(grant.request.holder_id, grant.request.owner.key, grant.taken))

    async def arelease(self, grant: Grant) -> bool:
        return await self._arun(self._release_steps(grant.request.holder_id, grant.request.owner.key, grant.taken))

    def force_release(self, holder_id: str, nodes: Sequence[Node]) -> bool:
        return self._run(self._release_steps(holder_id, None, nodes))

    def _release_steps(
        self, holder_id: str, owner_key: str | None, nodes: Sequence[Node], *, quiet: bool = False
    ) -> Steps[bool]:
        """Remove ``holder_id`` (of ``owner_key``, or anyone's) from ``nodes``; True if it was on all.

        A node this holder created and that nobody wrote since is deleted
        outright (if ``_seq_no`` still matches); the others, and any such
        delete that fails, go through the RELEASE script. A release resent
        after a lost answer (:meth:`_call_steps`) may find the holder gone by
        its own first send: then a missing holder does not count as lost.
        """
        sole = self._forget_sole(holder_id)
        if not nodes:
            return True
        # Quiet, the caller is failing already: a short try, and the lease ends what it leaves.
        retry_for = QUIET_RELEASE_RETRY if quiet else None
        params = {
            "holder_id": holder_id,
            "owner_key": owner_key,
            "tombstone_ms": RELEASE_TOMBSTONE_MS,
            "tombstones_kept": RELEASE_TOMBSTONES_KEPT,
        }
        operations: list[dict[str, Any]] = []
        for node in nodes:
            if node.id in sole:
                operations.append(self._delete_unchanged(self.index_of(node.namespace), node.id, *sole[node.id]))
            else:
                operations += self._scripted(node, scripts.RELEASE, params)
        resent: list[bool] = []
        try:
            items = yield from self._bulk_steps(operations, "release", retry_for=retry_for, resent=resent)
            changed = [
                node for node, item in zip(nodes, items, strict=True) if "delete" in item and _result(item) != "deleted"
            ]
            scripted = [(node, item) for node, item in zip(nodes, items, strict=True) if "update" in item]
            if changed:
                operations = [op for node in changed for op in self._scripted(node, scripts.RELEASE, params)]
                again = yield from self._bulk_steps(operations, "release", retry_for=retry_for, resent=resent)
                scripted += zip(changed, again, strict=True)
        except LockBackendUnavailable:
            if quiet:
                return False  # the lease will end it; the caller is already failing
            raise
        deleted = [node for node, item in zip(nodes, items, strict=True) if _result(item) == "deleted"]
        self._note_existing([], deleted + [node for node, item in scripted if _result(item) == "deleted"])
        all_there = True
        failures = []
        noops = []
        for node, item in scripted:
            body = item["update"]
            if body.get("result") in ("updated", "deleted"):
                continue
            if body.get("status") not in (None, 200, 404):
                failures.append(f"{node}: {body.get('error')}")
                all_there = False
            elif resent:
                continue  # our own first send may have done it
            elif body.get("result") == "noop":
                noops.append(node)  # holder not here: released by us already (a replay), or lost
            else:
                all_there = False  # node gone (404): undecidable, see _released_steps
        if failures and not quiet:
            raise LockBackendUnavailable(f"Elasticsearch failed to release: {'; '.join(failures)}")
        if noops and all_there:
            all_there = yield from self._released_steps(holder_id, owner_key, noops)
        return all_there

    def _released_steps(self, holder_id: str, owner_key: str | None, nodes: Sequence[Node]) -> Steps[bool]:
        """Return True if each of ``nodes`` keeps the tombstone of ``holder_id``'s release by ``owner_key``.

        Elasticsearch re-executes a write on the new primary when the old one
        failed before answering, even if it had applied and replicated the
        write: a release replayed so finds its holder gone (a no-op). The
        tombstone RELEASE leaves on a node that stays tells that replay from a
        lock lost to an eviction, a take-over or a forced release. A node the
        first execution deleted (its last holder and marker gone) keeps no
        tombstone: a replay that finds it gone (404) is reported lost, as is a
        lost lock.
        """
        docs = [{"_index": self.index_of(node.namespace), "_id": node.id} for node in nodes]
        try:
            answer = yield from self._call_steps("read released lock nodes", _Api("mget", {"docs": docs}))
        except LockBackendUnavailable:
            return False  # unproven: reported lost
        return all(
            doc.get("found") and _released_here(doc.get("_source") or {}, holder_id, owner_key)
            for doc in answer["docs"]
        )

    def renew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> bool:
        return _renewed_or_busy(self._run(self._renew_steps([grant], checkpoint, recovery, timeout)))

    async def arenew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> bool:
        return _renewed_or_busy(await self._arun(self._renew_steps([grant], checkpoint, recovery, timeout)))

    def renew_many(self, grants: Sequence[Grant], *, timeout: float | None = None) -> list[bool | None]:
        return [renewed for renewed, _ in self._run(self._renew_steps(grants, None, None, timeout))]

    def _renew_items(
        self, grant: Grant, checkpoint: dict[str, Any] | None, recovery: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        """Return the ``_bulk`` lines of RENEW for ``grant``: the checkpoint to its main node(s) alone."""
        params = renew_params(grant, checkpoint, recovery)
        others = {**params, "checkpoint": None}  # the shared ancestors stay small
        asked = dict(grant.request.targets)
        fields = ["holders.id", "waiters.id", "waiters.released"]
        return [
            op
            for node in grant.taken
            for op in self._scripted(
                node, scripts.RENEW, params if modes.is_grant(asked[node]) else others, fields=fields
            )
        ]

    def _renew_steps(
        self,
        grants: Sequence[Grant],
        checkpoint: dict[str, Any] | None,
        recovery: dict[str, Any] | None,
        timeout: float | None,
    ) -> Steps[list[tuple[bool | None, str]]]:
        """Renew ``grants`` in one ``_bulk``; return per grant True, False (lost) or None (busy), and why busy."""
        deadline = None if timeout is None else time.monotonic() + timeout
        operations = [op for grant in grants for op in self._renew_items(grant, checkpoint, recovery)]
        if not operations:
            return [(True, "")] * len(grants)
        # Retried by the renewer within the lease, not here.
        items = yield from self._bulk_steps(operations, "renew", retry_for=0, deadline=deadline)
        outcomes: list[tuple[bool | None, str]] = []
        start = 0
        for grant in grants:
            mine, start = items[start : start + len(grant.taken)], start + len(grant.taken)
            self._renewed_sole(grant.request.holder_id, grant.taken, mine)
            transient = [i["update"] for i in mine if i["update"].get("status") in BUSY_STATUSES | {409}]
            if transient:
                outcomes.append((None, str(transient[0].get("error"))))
            else:
                outcomes.append((all(item["update"].get("result") == "updated" for item in mine), ""))
        return outcomes

    # --- inspection and maintenance -------------------------------------------

    def _refresh(self, namespace: str | None = None) -> None:
        indices = self._indices_of(namespace)
        self._call("refresh the lock index", _Api("indices.refresh", {"index": indices, "ignore_unavailable": True}))

    def _index_exists(self, namespace: str | None = None) -> bool:
        """Return whether the lock index of ``namespace`` exists (any lock index, for None)."""
        indices = [self.index_of(namespace)] if namespace is not None else self.lock_indices
        return any(self._call("look up the lock index", _Api("indices.exists", {"index": i})) for i in indices)

    def holders(
        self,
        *,
        namespace: str | None = None,
        path_prefix: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        mode: modes.Mode | None = None,
        host: str | None = None,
        expired: bool | None = None,
        parent: str | None = None,
    ) -> HolderPage:
        if not self._index_exists(namespace):
            return HolderPage([], None)
        self._refresh(namespace)
        filters: list[dict[str, Any]] = []
        if namespace is not None:
            filters.append({"term": {"namespace": namespace}})
        if path_prefix:
            filters.append({"prefix": {"key": path_prefix}})
        if parent is not None:
            filters.append({"term": {"kind": Kind.TREE.value}})
            if parent:
                filters.append({"term": {"parent": parent}})
            else:
                filters.append({"term": {"depth": 1}})
        holder_filters: list[dict[str, Any]] = []
        if mode is not None:
            holder_filters.append({"term": {"holders.mode": modes.Mode(mode).value}})
        if host is not None:
            holder_filters.append({"term": {"holders.owner.host": host}})
        if expired is not None:
            holder_filters.append({"range": {"holders.expires_at": {"lte" if expired else "gt": "now"}}})
        if holder_filters:
            filters.append(
                {
                    "nested": {
                        "path": "holders",
                        "query": {"bool": {"filter": holder_filters}},
                        "inner_hits": {"size": 100, "name": "match"},
                    }
                }
            )
        body: dict[str, Any] = {"query": {"bool": {"filter": filters}}, "sort": _SORT, "size": limit}
        if cursor:
            body["search_after"] = _decode_cursor(cursor)
        search = _Api("search", {"index": self._indices_of(namespace), "ignore_unavailable": True, **body})
        hits = self._call("list holders", search)["hits"]["hits"]
        records = []
        for hit in hits:
            inner = hit.get("inner_hits", {}).get("match")
            records.extend(_records(hit["_source"], [h["_source"] for h in inner["hits"]["hits"]] if inner else None))
        next_cursor = _encode_cursor(hits[-1]["sort"]) if len(hits) == limit else None
        return HolderPage(records, next_cursor)

    def wait_state(self, nodes: Sequence[Node] | None = None) -> WaitState:
        return self._run(self._wait_state_steps(nodes))

    async def await_state(self, nodes: Sequence[Node] | None = None) -> WaitState:
        return await self._arun(self._wait_state_steps(nodes))

    def _wait_state_steps(self, nodes: Sequence[Node] | None) -> Steps[WaitState]:
        """Read nodes with live markers (a search after a refresh), or ``nodes`` as they are now (a realtime mget).

        Liveness is judged against the clock of the node that answers a
        ``_nodes/_local/stats`` read just before: a store clock, as the
        listing's ``now``. Reads only: a missing lock index is no waiting.
        """
        stats = _Api("nodes.stats", {"node_id": "_local", "metric": "process", "filter_path": "nodes.*.timestamp"})
        now_ms = next(iter((yield from self._call_steps("read the store's clock", stats))["nodes"].values()))[
            "timestamp"
        ]
        sources: list[Mapping[str, Any]] = []
        if nodes is None:
            indices = ",".join(self.lock_indices)
            refresh = _Api("indices.refresh", {"index": indices, "ignore_unavailable": True})
            yield from self._call_steps("refresh the lock index", refresh)
            body: dict[str, Any] = {
                "query": {"range": {"waiting_until": {"gt": now_ms}}},
                "sort": _SORT,
                "size": self.page_size,
                "_source": ["namespace", "kind", "key", "holders", "waiters"],
                "track_total_hits": False,
            }
            while True:
                search = _Api("search", {"index": indices, "ignore_unavailable": True, **body})
                hits = (yield from self._call_steps("find waiting requests", search))["hits"]["hits"]
                sources.extend(hit["_source"] for hit in hits)
                if len(hits) < self.page_size:
                    break
                body["search_after"] = hits[-1]["sort"]
        else:
            by_index: dict[str, list[str]] = {}
            for node in nodes:
                by_index.setdefault(self.index_of(node.namespace), []).append(node.id)
            for index, ids in sorted(by_index.items()):
                mget = _Api(
                    "mget", {"index": index, "ids": sorted(set(ids)), "realtime": True}, options={"ignore_status": 404}
                )
                docs = (yield from self._call_steps("read waiting requests", mget)).get("docs", ())
                sources.extend(doc["_source"] for doc in docs if doc.get("found"))
        return _wait_state(sources, now_ms)

    def node_holders(self, node: Node) -> list[HolderRecord]:
        if not self._index_exists(node.namespace):
            return []
        get = _Api("get", {"index": self.index_of(node.namespace), "id": node.id}, options={"ignore_status": 404})
        response = self._call("read a lock node", get)
        return _records(response["_source"]) if response.get("found") else []

    page_size = 5000
    """Nodes per search page: every search costs a scan of the index on noida-db, so few, large pages."""

    def evict_expired(
        self,
        *,
        namespace: str | None = None,
        grace: float = 0.0,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> list[HolderRecord]:
        """Delete the nodes whose holders are all long expired outright, then run EVICT on the rest.

        The first pass asks for no inner hits (noida-db's dearest part of a
        search) and deletes conditional on the ``_seq_no`` the search saw, so
        a node written since is left to the second pass, where EVICT compares
        ``ctx._now`` to the millisecond.
        """
        evicted: list[HolderRecord] = []
        if not dry_run:
            live = {
                "nested": {"path": "holders", "query": {"bool": {"must_not": _expired_query(grace, STALE_MARGIN_S)}}}
            }
            stale = {"path": "holders", "query": _expired_query(grace, STALE_MARGIN_S)}
            for hits in self._search_pages(stale, namespace=namespace, must_not=live, inner_hits=False):
                evicted.extend(self._delete_stale(hits))
                if progress is not None:
                    progress(len(evicted))
        for page in self._holder_pages(_expired_query(grace), namespace=namespace, keep=_evictable):
            found = page
            if dry_run:
                evicted.extend(found)
            elif found:
                evicted.extend(self._evict(found, max(0, round(grace * 1000))))
            if progress is not None:
                progress(len(evicted))
        return evicted

    def _delete_stale(self, hits: list[dict[str, Any]]) -> list[HolderRecord]:
        """Delete the nodes of ``hits`` (all holders stale) that carry no intent and no marker, if unchanged."""
        chosen = [
            hit
            for hit in hits
            if not _markers(hit["_source"]) and not any(_awaits_recovery(h) for h in hit["_source"]["holders"])
        ]
        if not chosen:
            return []
        self._run(self._ensure_index_steps())
        with self._sole_lock:
            current = set(self._current.values())
        # Through the alias, and only from the incarnation it names: sequence numbers start over in another.
        chosen = [hit for hit in chosen if hit["_index"] in current]
        operations = [
            self._delete_unchanged(
                self.index_of(hit["_source"]["namespace"]), hit["_id"], hit["_seq_no"], hit["_primary_term"]
            )
            for hit in chosen
        ]
        items = self._bulk(operations, "evict expired holders")
        return [
            r
            for hit, item in zip(chosen, items, strict=True)
            if _result(item) == "deleted"
            for r in _records(hit["_source"])
        ]

    def _evict(self, found: list[HolderRecord], grace_ms: int) -> list[HolderRecord]:
        """Run EVICT on the nodes of ``found``; delete the nodes it left empty, if nobody wrote them since."""
        by_node: dict[Node, list[HolderRecord]] = {}
        for record in found:
            by_node.setdefault(record.node, []).append(record)
        params = {"grace_ms": grace_ms}
        fields = ["holders.id", "waiters.id", "waiters.released"]
        operations = [op for node in by_node for op in self._scripted(node, scripts.EVICT, params, fields=fields)]
        items = self._bulk(operations, "evict expired holders")
        evicted: list[HolderRecord] = []
        emptied: list[dict[str, Any]] = []
        for (node, records), item in zip(by_node.items(), items, strict=True):
            body = item["update"]
            if body.get("result") != "updated":
                continue
            source = body.get("get", {}).get("_source") or {}
            left = {h["id"] for h in source.get("holders") or ()}
            evicted.extend(r for r in records if r.holder_id not in left)
            if not left and not _markers(source):
                index = self.index_of(node.namespace)
                emptied.append(self._delete_unchanged(index, node.id, body["_seq_no"], body["_primary_term"]))
        if emptied:
            self._bulk(emptied, "delete emptied lock nodes")  # a 409 means someone took the node since: keep it
        return evicted

    def _delete_unchanged(self, index: str, node_id: str, seq_no: int, primary_term: int) -> dict[str, Any]:
        """Return the ``_bulk`` line deleting a node only if its last write is still the one at ``seq_no``."""
        return {"delete": {"_index": index, "_id": node_id, "if_seq_no": seq_no, "if_primary_term": primary_term}}

    def _search_pages(
        self,
        nested: dict[str, Any],
        *,
        namespace: str | None = None,
        must_not: dict[str, Any] | None = None,
        inner_hits: bool = True,
    ) -> Iterator[list[dict[str, Any]]]:
        """Yield, page by page, the hits of nodes with a holder matching the ``nested`` query.

        The matching holders come as inner hits "match" unless ``inner_hits``
        is False; ``must_not`` excludes nodes. Hits carry ``_seq_no`` and
        ``_primary_term``.
        """
        if not self._index_exists(namespace):
            return
        self._refresh(namespace)
        if inner_hits:
            nested = {**nested, "inner_hits": {"size": 100, "name": "match"}}
        filters: list[dict[str, Any]] = [{"nested": nested}]
        if namespace is not None:
            filters.append({"term": {"namespace": namespace}})
        query: dict[str, Any] = {"bool": {"filter": filters}}
        if must_not is not None:
            query["bool"]["must_not"] = [must_not]
        body: dict[str, Any] = {
            "query": query,
            "sort": _SORT,
            "size": self.page_size,
            "seq_no_primary_term": True,
            "track_total_hits": False,
        }
        while True:
            search = _Api("search", {"index": self._indices_of(namespace), "ignore_unavailable": True, **body})
            hits = self._call("search holders", search)["hits"]["hits"]
            if hits:
                yield hits
            if len(hits) < self.page_size:
                return
            body["search_after"] = hits[-1]["sort"]

    def _holder_pages(
        self,
        nested_query: dict[str, Any],
        *,
        namespace: str | None = None,
        keep: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> Iterator[list[HolderRecord]]:
        """Yield, page by page, the holders matching ``nested_query`` (by inner hits) that ``keep`` accepts."""
        for hits in self._search_pages({"path": "holders", "query": nested_query}, namespace=namespace):
            yield [record for hit in hits for record in _hit_records(hit, keep)]

    def holder_records(self, holder_id: str) -> list[HolderRecord]:
        return [r for page in self._holder_pages({"term": {"holders.id": holder_id}}) for r in page]

    def expired_with_intent(self, *, namespace: str | None = None, grace: float = 0.0) -> list[HolderRecord]:
        pages = self._holder_pages(_expired_query(grace), namespace=namespace, keep=_awaits_recovery)
        return [r for page in pages for r in page]

    def take_over(
        self,
        records: Sequence[HolderRecord],
        owner: Owner,
        *,
        ttl: float,
        recovery: dict[str, Any] | None,
        require_expired: bool = True,
        require_live: bool = False,
        require_unchanged: bool = False,
    ) -> Grant | None:
        records, arbiter, request = takeover_request(
            records, owner, ttl, require_expired=require_expired, require_live=require_live
        )
        params = {
            "holder_id": arbiter.holder_id,
            "owner": owner.as_dict(),
            "ttl_ms": request.ttl_ms,
            "recovery": recovery,
            "require_expired": require_expired,
            "require_live": require_live,
        }

        def operations(
            batch: Sequence[HolderRecord], expected_owner_key: str | None, expected_expires_at: int | None = None
        ) -> list[dict[str, Any]]:
            script_params = {
                **params,
                "expected_owner_key": expected_owner_key,
                "expected_expires_at": expected_expires_at,
            }
            return [op for r in batch for op in self._scripted(r.node, scripts.TAKE_OVER, script_params)]

        # The arbiter alone first: whoever updates it owns the recovery.
        lease = expires_ms(arbiter) if require_unchanged else None
        (item,) = self._bulk(operations([arbiter], arbiter.owner.get("key"), lease), "take a holder over")
        if item["update"].get("result") != "updated":
            return None
        token = _token(item["update"])
        others = [r for r in records if r is not arbiter]
        if others:
            for item in self._bulk(operations(others, None), "take a holder over"):
                if item["update"].get("result") == "updated":
                    token = max(token, _token(item["update"]))
        return Grant(request=request, token=token, taken=tuple(r.node for r in records))

    # --- checks ---------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        try:
            with self._translate("reach the cluster"):
                client = self.client.options(request_timeout=5)
                data_nodes = int(client.cluster.health()["number_of_data_nodes"])
                node_settings = client.nodes.info(metric="settings", flat_settings=True).get("nodes", {})
                content_lengths = [
                    size
                    for info in node_settings.values()
                    if (size := byte_size(info.get("settings", {}).get("http.max_content_length", "100mb")))
                ]
                found = {}
                for index in self.lock_indices:
                    if client.indices.exists(index=index):
                        mapping = client.indices.get_mapping(index=index)
                        found[index] = (mapping, client.indices.get_settings(index=index))
        except LockBackendUnavailable as e:
            return [
                checks.Error(
                    str(e),
                    hint="Start Elasticsearch or fix LOCK_BACKEND['OPTIONS']['hosts'].",
                    id="django_esdlock.E002",
                )
            ]
        errors = []
        for index, (mapping, settings) in found.items():
            concrete, body = next(iter(mapping.items()))
            actual = body["mappings"]
            properties = actual.get("properties")
            earlier = {1: ADDED_SINCE_VERSION_1 + ADDED_SINCE_VERSION_2, 2: ADDED_SINCE_VERSION_2}
            version = {1: PROPERTIES_OF_VERSION_1, 2: PROPERTIES_OF_VERSION_2}
            lacking = next((earlier[v] for v, props in version.items() if properties == props), None)
            if lacking is not None and actual.get("dynamic") == "strict":
                errors.append(
                    checks.Warning(
                        f"Elasticsearch index {index!r} has the lock mapping of an earlier release.",
                        hint=f"The backend adds {', '.join(lacking)} at its first use; until then "
                        "processes of this release cannot write there.",
                        id="django_esdlock.W006",
                    )
                )
            elif actual.get("dynamic") not in ("strict", False) or properties != MAPPING["properties"]:
                errors.append(
                    checks.Error(
                        f"Elasticsearch index {index!r} has a mapping that is not django-esdlock's lock mapping.",
                        hint="Point OPTIONS['index'] at a new index name, or delete the index when no lock is held.",
                        id="django_esdlock.E003",
                    )
                )
            if concrete == index:
                errors.append(
                    checks.Warning(
                        f"Elasticsearch lock index {index!r} is an index of an earlier release, not an alias: "
                        "if it is lost, fencing tokens may go back.",
                        hint="When no lock is held, delete it (the backend then creates the alias and its index), or "
                        "set OPTIONS['token_floor'] above the highest token given out: the next process replaces "
                        "it (see 'Restoring a lock store' in the README).",
                        id="django_esdlock.W008",
                    )
                )
            elif token_floor_of(concrete) < self.token_floor:
                errors.append(
                    checks.Warning(
                        f"Elasticsearch lock index {index!r} gives tokens above {token_floor_of(concrete)}, below "
                        f"OPTIONS['token_floor'] {self.token_floor}.",
                        hint="The next process of these settings that writes replaces it by one above the floor "
                        "(its holders are lost then).",
                        id="django_esdlock.W009",
                    )
                )
            index_settings = next(iter(settings.values()))["settings"]["index"]
            shards = index_settings.get("number_of_shards")
            if str(shards) != "1":
                errors.append(
                    checks.Error(
                        f"Elasticsearch index {index!r} has {shards} primary shards; fencing tokens need exactly 1.",
                        hint="Recreate the lock index with one primary shard.",
                        id="django_esdlock.E004",
                    )
                )
            errors.extend(self._durability_warnings(index, index_settings, data_nodes))
            nested_limit = index_settings.get("mapping", {}).get("nested_objects", {}).get("limit")
            errors.extend(self._holders_warnings(index, int(nested_limit or NESTED_OBJECTS_LIMIT)))
        missing = [i for i in self.lock_indices if i not in found]
        if data_nodes > 1 and missing:  # judged by the settings they will be created with
            errors.extend(self._durability_warnings(missing[0], self._index_settings(), data_nodes, planned=True))
        if missing:
            errors.extend(self._holders_warnings(missing[0], NESTED_OBJECTS_LIMIT, planned=True))
        errors.extend(self._bulk_warnings(content_lengths))
        return errors

    def _holders_warnings(self, index: str, nested_limit: int, *, planned: bool = False) -> list[checks.CheckMessage]:
        """Warn when ``max_holders_per_node`` lets a node keep more holders than the index's nested-objects limit."""
        if self.max_holders_per_node <= nested_limit:
            return []
        which = "would be created with" if planned else "has"
        return [
            checks.Warning(
                f"OPTIONS['max_holders_per_node'] is {self.max_holders_per_node:,}, but lock index {index!r} {which} "
                f"index.mapping.nested_objects.limit {nested_limit:,}: Elasticsearch refuses a node past it (400).",
                hint=f"Lower OPTIONS['max_holders_per_node'] to {nested_limit:,}, or raise the limit "
                f'(PUT {index}/_settings {{"index.mapping.nested_objects.limit": {self.max_holders_per_node}}}).',
                id="django_esdlock.W007",
            )
        ]

    def largest_bulk(self) -> int:
        """Return the bytes of the largest ``_bulk`` a request within the caps may send, about (an upper bound).

        A document lock of ``MAX_IDS_PER_REQUEST`` ids, each renewed with a
        checkpoint of ``MAX_CHECKPOINT_BYTES``, or a tree lock of the deepest
        path that carries an intent of ``MAX_INTENT_BYTES``; ids and paths of
        the longest key.
        """
        node = Node("n" * 100, Kind.DOCUMENT, "k" * paths.MAX_PATH_LENGTH)
        request = LockRequest(
            "h" * 32, Owner.current(), ((node, modes.Mode.X),), self.ttl, reentrant=True, ticket=time.time_ns()
        )
        holder = {"id": request.holder_id, "owner": request.owner.as_dict(), "has_intent": True}
        grant = Grant(request, 1 << 50, (node,))
        items = [
            self._acquire_items(request.targets, holder, request),
            self._create_item(node, modes.Mode.X, holder, request),
            self._scripted(node, scripts.RENEW, renew_params(grant, None, {"state": "running", "attempts": 99})),
        ]
        item = max(sum(len(json.dumps(line, ensure_ascii=False).encode()) + 1 for line in lines) for lines in items)
        documents = self.limits.ids_per_request * (item + self.limits.checkpoint_bytes)
        tree = paths.MAX_DEPTH * item + max(self.limits.intent_bytes, self.limits.checkpoint_bytes)
        return max(documents, tree)

    def _bulk_warnings(self, content_lengths: Sequence[int]) -> list[checks.CheckMessage]:
        """Warn when the caps let a request send a ``_bulk`` larger than a node's ``http.max_content_length``."""
        if not content_lengths:
            return []
        largest, limit = self.largest_bulk(), min(content_lengths)
        if largest <= limit:
            return []
        return [
            checks.Warning(
                f"LOCK_BACKEND's caps let one request send a _bulk of about {largest:,} bytes, over the "
                f"http.max_content_length of {limit:,} bytes of an Elasticsearch node: it would be refused (413).",
                hint="Lower LOCK_BACKEND['MAX_IDS_PER_REQUEST'], ['MAX_CHECKPOINT_BYTES'] or ['MAX_INTENT_BYTES'], "
                "or raise http.max_content_length on every node.",
                id="django_esdlock.W007",
            )
        ]

    def _durability_warnings(
        self, index: str, settings: Mapping[str, Any], data_nodes: int, *, planned: bool = False
    ) -> list[checks.CheckMessage]:
        """Warn when a lock index on a cluster of ``data_nodes`` cannot keep a grant through the loss of one node.

        It cannot when it would keep a single copy there, or when a write may be
        acknowledged by fewer than two copies (``wait_for_active_shards`` 1). A
        single-node cluster has no node to lose: nothing to warn about.
        """
        if data_nodes < 2:
            return []
        expand = settings.get("auto_expand_replicas")
        if expand not in (None, False, "false"):
            copies = _copies(str(expand), data_nodes)
        else:
            copies = 1 + int(settings.get("number_of_replicas", 1))
        wait = self.wait_for_active_shards
        acked_by = copies // 2 + 1 if wait == "auto" else copies if wait == "all" else int(wait)
        if copies >= 2 and acked_by >= 2:
            return []
        which = "would be created" if planned else "is"
        reason = (
            f"keeps {copies} copy on {data_nodes} data nodes"
            if copies < 2
            else "acknowledges a write from the primary alone (wait_for_active_shards 1)"
        )
        return [
            checks.Warning(
                f"Elasticsearch lock index {index!r} {which} unable to keep a grant through the loss of one node: "
                f"it {reason}.",
                hint="Give it replicas (OPTIONS['number_of_replicas'], default '0-2', or "
                f"PUT {index}/_settings) and leave OPTIONS['wait_for_active_shards'] at 'auto' (a majority).",
                id="django_esdlock.W005",
            )
        ]
