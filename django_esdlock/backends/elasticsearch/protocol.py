"""The lock protocol on Elasticsearch: acquire, release, renew, withdraw and the waiting state, as steps.

Each operation is one generator of store calls (:mod:`.transport`), driven
by :func:`~django_esdlock.steps.drive` for the blocking method and by
:func:`~django_esdlock.steps.adrive` for its async twin; the Painless
scripts it sends are in :mod:`.scripts`, and how their answers read in
:mod:`.answers`.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ... import modes, paths
from ...exceptions import LockBackendUnavailable, LockStoreBusy
from ...records import Grant, Kind, LockRequest, Node, WaitState
from ...steps import Steps, adrive, drive
from ..base import renew_params
from . import answers, scripts
from .answers import BUSY_STATUSES, MARKER_OWNER_FIELDS
from .transport import StoreCall

RETRY_ON_CONFLICT = 10
"""A real cluster answers 409 to concurrent updates of one node; retry on the shard."""

SOLE_HOLDS_KEPT = 10_000
"""Holders whose conditional-delete facts (:meth:`Protocol._note_sole`) a backend keeps, at most."""

RELEASE_TOMBSTONE_MS = 60_000
"""How long a node that outlives a release keeps its tombstone (see :func:`.answers.released_here`): longer than a
request can be re-executed after it was applied (the write timeout, a new primary, the client's resends)."""

RELEASE_TOMBSTONES_KEPT = 16
"""Release tombstones one node keeps at most, the newest: a hot shared node is not left to grow."""

MARKER_TTL_RTTS = 8
"""A waiting marker lasts at least this many acquire answers (see ``_marker_ttl_ms``)."""

RTT_SMOOTHING = 0.2
"""Weight of the latest acquire's answer time in the smoothed one."""

HEAD_POLL_FLOOR = 0.001
"""Seconds the head of a queue pauses between two tries, at least (see ``queued_poll_interval``)."""

QUIET_RELEASE_RETRY = 1.0
"""Seconds an acquire that failed keeps trying to give back what it took; the lease ends the rest."""

ACQUIRE_CALL_BOUND = 6.0
"""Seconds one try of an acquire may wait for the store, at most (less when the lease is shorter: a grant answered
after its lease is lost at once). A node that holds a write back (a primary whose replica went silent, a cluster
without a master) would otherwise keep a request with a timeout of 0 for the client's ``request_timeout`` per node."""

RELEASE_CALL_BOUND = 8.0
"""Seconds a release may wait for the store, busy answers retried included; the lease ends what it leaves."""

QUIET_RELEASE_BOUND = 2.0
"""Seconds the give-back of a failed acquire, or the withdrawal of a request's waiting markers, may wait for the
store: the caller is failing or giving up already, and the lease or the marker's own expiry ends what is left."""

READ_ONLY = "ctx.op = 'none'"
"""The script of a scripted update that only reads a node: on its primary, from the translog (see ``_gone_steps``)."""

SORT = [{"namespace": "asc"}, {"kind": "asc"}, {"key": "asc"}]
"""The order of lock nodes in every search: a stable order for pages."""

_entry_writes = itertools.count(1)
"""Numbers the ancestor entries this process writes (``write``): a holder's every write has its own."""


def marker_fields(request: LockRequest) -> dict[str, Any]:
    """Return the owner fields a waiting marker of ``request`` records, flat (see ACQUIRE)."""
    owner = request.owner.as_dict()
    fields = {name: owner[name] for name in MARKER_OWNER_FIELDS}
    if request.holds_others:
        fields["owner"] = request.owner.key
    return fields


def main_node(request: LockRequest) -> Node | None:
    """Return the main node of a tree lock (its S or X node, below its ancestors); None for other locks."""
    node, mode = request.targets[-1]
    return node if node.kind is Kind.TREE and modes.is_grant(mode) else None


def holder_entry(holder: Mapping[str, Any], mode: modes.Mode, request: LockRequest) -> dict[str, Any]:
    """Return the holder entry a request writes on a node it takes in ``mode``: the intent on its main node only.

    Its other nodes (the IS/IX ancestors of a tree lock) carry ``has_intent``
    (in ``holder``) instead: they are shared, and every other holder's write
    there rewrites every entry. They name the main node (``main``): where to
    look whether the entry still holds, and which write of the entry they are
    (``write``), so that an entry read is never taken for a later one of the
    same holder (see "Ancestors" in :class:`Protocol`).
    """
    entry = {**holder, "mode": mode.value}
    if modes.is_grant(mode):
        if request.intent is not None:
            entry["intent"] = request.intent
    else:
        main = main_node(request)
        if main is not None:
            entry["main"] = main.id
            entry["write"] = next(_entry_writes)
    return entry


def gone_entry(entry: Mapping[str, Any]) -> list[Any]:
    """Return ACQUIRE's ``gone`` item for an ancestor ``entry`` read without its holder on its main node."""
    return [entry["id"], entry["write"], (entry.get("owner") or {}).get("key")]


def bottom_up(targets: Sequence[tuple[Node, modes.Mode]]) -> list[tuple[Node, modes.Mode]]:
    """Return ``targets`` deepest first: a tree lock's main node before its ancestors (see "Ancestors")."""
    return sorted(targets, key=lambda target: -target[0].key.count("/") if target[0].kind is Kind.TREE else 0)


def unique(nodes: Sequence[Node]) -> list[Node]:
    """Return ``nodes`` without repeats, in order (a node written again to keep an ancestor's order)."""
    return list(dict.fromkeys(nodes))


def node_fields(node: Node) -> dict[str, Any]:
    """Return the source fields that name ``node``."""
    tree = node.kind is Kind.TREE
    return {
        "namespace": node.namespace,
        "kind": node.kind.value,
        "key": node.key,
        "parent": paths.parent(node.key) if tree else None,
        "depth": node.key.count("/") if tree else 0,
    }


def _renewed_or_busy(outcomes: Sequence[tuple[bool | None, str]]) -> bool:
    """The outcome of renewing one grant: raise LockStoreBusy if the store turned it away for now."""
    ((renewed, busy),) = outcomes
    if renewed is None:
        raise LockStoreBusy(f"Elasticsearch was too busy to renew: {busy}")
    return renewed


def standing_item(mine: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """Of one node's items in a release ``_bulk`` (by verb), the one that says how its release went.

    Its delete, when that took the node or went alone; else the RELEASE that
    went behind it (which found the node gone if the delete took it).
    """
    delete = mine.get("delete")
    if delete is not None and (answers.result(delete) == "deleted" or "update" not in mine):
        return delete
    return mine["update"]


def delete_unchanged(index: str, node_id: str, seq_no: int, primary_term: int) -> dict[str, Any]:
    """Return the ``_bulk`` line deleting a node only if its last write is still the one at ``seq_no``."""
    return {"delete": {"_index": index, "_id": node_id, "if_seq_no": seq_no, "if_primary_term": primary_term}}


class Protocol:
    """The lock operations of an :class:`~django_esdlock.backends.elasticsearch.ElasticsearchLockBackend`.

    A mixin of the backend: it writes through :class:`~.transport.Transport`'s
    ``_bulk`` and keeps what this process learnt of its own writes (nodes it
    alone holds, nodes that exist, where a waiting request stands).

    Ancestors: a tree lock's release writes its main node (its S or X node)
    and the ancestors it alone held (a conditional delete), not the IS/IX
    entries it shares with others: those stay behind, naming their main node
    (``main``), until this process next writes that ancestor (``gone``), their
    lease ends, or someone who needs the ancestor shows they no longer hold.
    Someone refused there by such entries reads their main nodes (on the
    primary) and asks again with those whose holder is not there as ``gone``.
    That is sound because an entry is only ever written after its holder's
    main node was taken, or written again after it: each request writes
    bottom-up (one shard applies a ``_bulk`` in order), and an acquire whose
    main node is taken in a later ``_bulk`` than an ancestor writes that
    ancestor again behind it. So an entry whose main node lacks its holder
    belongs to a holder that let go or has not been granted yet, and a
    ``gone`` entry is dropped only if it is still the very write that was
    read: a rewrite behind a late grant is kept, or refused by the
    newcomer's grant. Each write of an entry is numbered by its process
    (``write``): a store timestamp cannot tell two writes apart (7.0 caches
    the clock scripts read for up to 200 ms, and a request that gave its
    ancestor back and was granted later writes the entry anew).
    """

    def _init_protocol(self) -> None:
        self._sole: dict[str, dict[str, tuple[int, int, str]]] = {}
        """holder id -> node id -> (seq_no, primary_term, concrete index) of our last write, where it left that
        holder alone."""
        self._existing: dict[str, None] = {}
        """Ids of nodes lately found existing, oldest first (a hint: a wrong one costs a round trip)."""
        self._blocked: dict[str, tuple[frozenset[str], int]] = {}
        """holder id of a waiting request -> ids of the nodes that refused its last attempt, and its queue place."""
        self._acquire_rtt = 0.0
        """Seconds an acquire takes to answer, smoothed: a waiting marker outlasts a few of them."""
        self._full: dict[str, list[tuple[Node, int]]] = {}
        """holder id -> the nodes that refused its last attempt for keeping max_holders_per_node holders."""
        self._left: dict[str, dict[str, str | None]] = {}
        """node id -> ids of this process's holders released without a write there (shared ancestors): sent as
        ``gone`` with the next ACQUIRE of that node, which drops the entry of that id if it still has that owner (a
        holder taken over keeps its id). Only grants' releases leave entries: a released holder never writes
        again (a refused request, which may, gives back all)."""
        self._left_on: dict[str, list[str]] = {}
        """holder id -> the nodes of ``_left`` where it stays: forgotten when that holder writes again (a retry)."""

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

    # --- the primitive ------------------------------------------------------

    def acquire(self, request: LockRequest) -> Grant | None:
        return drive(self._acquire_steps(request), self.perform)

    async def aacquire(self, request: LockRequest) -> Grant | None:
        return await adrive(self._acquire_steps(request), self.aperform)

    def _acquire_steps(self, request: LockRequest) -> Steps[Grant | None]:
        """Create the nodes that do not exist (``create``), then take the others (ACQUIRE), all or nothing.

        Uncontended, every node is fresh and the first ``_bulk``, of plain
        ``create``s (see :mod:`.grants`), is the only one. A node a ``create``
        finds existing goes to ACQUIRE in a second ``_bulk``; nodes this
        backend lately found existing (shared ancestors, contended leaves) go
        to ACQUIRE in the first. A waiting request tries the nodes that refused
        it last time on their own first: while they still refuse, a poll
        writes nothing (its markers are fresh) and takes no ancestor it would
        only give back. A main node refused by ancestor entries left behind
        (see "Ancestors") is asked again at once, with those shown gone.
        """
        yield from self._ensure_index_steps()
        holder: dict[str, Any] = {"id": request.holder_id, "owner": request.owner.as_dict()}
        if request.intent is not None:
            holder["has_intent"] = True  # the intent itself goes to the main node alone (see holder_entry)
        with self._sole_lock:
            blocked, _ = self._blocked.pop(request.holder_id, ((), 0))
            self._full.pop(request.holder_id, None)
            self._forget_left(request.holder_id)  # it writes again: an entry of it is its own from now on
        probe = bottom_up([t for t in request.targets if t[0].id in blocked])
        sent = time.monotonic()
        deadline = sent + min(self.held_for(request.ttl), ACQUIRE_CALL_BOUND)
        outcome = answers.AcquireOutcome([], [], [], 0)
        try:
            if probe:
                items = yield from self._acquire_bulk_steps(probe, holder, request, deadline)
                outcome = answers.read_acquire_items(request, items, probe, max_holders=self.max_holders_per_node)
            if not (outcome.refused or outcome.errors or outcome.busy):
                rest = [t for t in request.targets if t not in probe]
                if any(modes.is_grant(mode) for _, mode in rest):  # ancestors taken alone go again behind it
                    rest += [t for t in probe if not modes.is_grant(t[1])]
                outcome = answers.merge(outcome, (yield from self._take_steps(rest, holder, request, deadline)))
            if outcome.suspects and outcome.refused and not (outcome.errors or outcome.busy):
                gone = yield from self._gone_steps(request, outcome.suspects, deadline)
                if gone:
                    # Everything again, deepest first, in one _bulk of ACQUIRE: taken nodes are written again.
                    again = bottom_up(request.targets)
                    items = yield from self._acquire_bulk_steps(again, holder, request, deadline, gone)
                    retried = answers.read_acquire_items(request, items, again, max_holders=self.max_holders_per_node)
                    retried.taken = outcome.taken + retried.taken  # what to give back if it fails
                    outcome = retried
        except LockBackendUnavailable:
            # A bulk may have been applied in part: give back whatever it took.
            nodes = [n for n, _ in request.targets]
            yield from self._release_steps(request.holder_id, request.owner.key, nodes, quiet=True)
            raise
        outcome.taken = unique(outcome.taken)
        took = time.monotonic() - sent
        self._acquire_rtt = (
            took if not self._acquire_rtt else self._acquire_rtt + (took - self._acquire_rtt) * RTT_SMOOTHING
        )
        if outcome.errors or outcome.refused or outcome.busy:
            failed = bool(outcome.errors or outcome.busy)
            # A busy item may have been written all the same (to too few shard copies): give back every node.
            given_back = [n for n, _ in request.targets] if outcome.busy else outcome.taken
            # Written back at once, ancestors too: a waiting request writes again under the same holder id, so no
            # entry of it may stay behind for this process to drop later (see _left).
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
        return Grant(
            request=request, token=outcome.token, taken=tuple(outcome.taken), holder_limit=outcome.holder_limit
        )

    def _gone_steps(
        self, request: LockRequest, suspects: Mapping[Node, Sequence[Mapping[str, Any]]], deadline: float
    ) -> Steps[dict[str, list[list[Any]]]]:
        """Return, per refused node, the ancestor entries among ``suspects`` whose holder is not on its main node.

        Each main node is read on its primary shard, by a scripted no-op
        update that answers the node from the translog: a realtime ``get``
        may be answered by a replica, which can lag behind a grant the
        primary applied. A main node that is not there holds nobody.
        """
        index = self.index_of(request.targets[0][0].namespace)
        mains = sorted({entry["main"] for entries in suspects.values() for entry in entries})
        operations: list[dict[str, Any]] = []
        for main in mains:
            header = {"_index": index, "_id": main, "_source": {"includes": ["holders.id"]}}
            operations += [{"update": header}, {"script": {"source": READ_ONLY, "lang": "painless"}}]
        items = yield from self._bulk_steps(operations, "read the main nodes of ancestor entries", deadline=deadline)
        holding: dict[str, set[str] | None] = {}  # main node id -> its holders (None: unknown)
        for main, item in zip(mains, items, strict=True):
            body = item["update"]
            if body.get("status") == 404 and (body.get("error") or {}).get("type") == "document_missing_exception":
                holding[main] = set()
            elif body.get("result") == "noop":
                holding[main] = {h.get("id") for h in (body.get("get", {}).get("_source") or {}).get("holders") or ()}
            else:
                holding[main] = None
        gone: dict[str, list[list[Any]]] = {}
        for node, entries in suspects.items():
            for entry in entries:
                there = holding.get(entry["main"])
                if there is not None and entry["id"] not in there:
                    gone.setdefault(node.id, []).append(gone_entry(entry))
        return gone

    def _may_leave(self, request: LockRequest) -> frozenset[str]:
        """The nodes whose entry a release of ``request`` may leave behind: a tree lock's ancestors, without an intent.

        An entry that awaits a recovery must go with its release: expired, it
        would still block (see ``has_intent``).
        """
        if request.intent is not None or main_node(request) is None:  # no main node: nowhere to show it gone
            return frozenset()
        return frozenset(node.id for node, mode in request.targets if not modes.is_grant(mode))

    def _forget_left(self, holder_id: str) -> None:
        """Forget the entries ``holder_id`` left behind (call with ``_sole_lock`` held)."""
        for node_id in list(self._left_on.get(holder_id, ())):
            self._drop_left(holder_id, node_id)

    def _drop_left(self, holder_id: str, node_id: str) -> None:
        """Forget the entry ``holder_id`` left on ``node_id`` (call with ``_sole_lock`` held)."""
        left = self._left.get(node_id)
        if left is not None:
            left.pop(holder_id, None)
            if not left:
                del self._left[node_id]
        nodes = self._left_on.get(holder_id)
        if nodes is not None:
            with contextlib.suppress(ValueError):
                nodes.remove(node_id)
            if not nodes:
                del self._left_on[holder_id]

    def _note_left(self, holder_id: str, owner_key: str | None, nodes: Sequence[Node]) -> None:
        """Remember that ``holder_id`` of ``owner_key`` was released from ``nodes`` without a write there."""
        if not nodes:
            return
        with self._sole_lock:
            for node in nodes:
                self._left.setdefault(node.id, {})[holder_id] = owner_key
            self._left_on.setdefault(holder_id, []).extend(node.id for node in nodes)
            while len(self._left_on) > SOLE_HOLDS_KEPT:
                self._forget_left(next(iter(self._left_on)))  # the oldest: the lease or a reader ends it

    def _left_of(self, node: Node) -> dict[str, str | None]:
        """Return this process's holders that left an entry on ``node``, with their owner key (ACQUIRE's ``gone``)."""
        with self._sole_lock:
            return dict(self._left.get(node.id, {}))

    def _forget_pruned(
        self, sent: Mapping[str, list[str]], batch: Sequence[tuple[Node, modes.Mode]], items: Sequence[Any]
    ) -> None:
        """Forget the entries ``sent`` as ``gone`` to the nodes of ``batch`` that ACQUIRE wrote (so dropped)."""
        if not sent:
            return
        with self._sole_lock:
            for (node, _), item in zip(batch, items, strict=True):
                if node.id not in sent or answers.result(item) not in ("created", "updated"):
                    continue  # refused without a write: still there, sent again next time
                for holder_id in sent[node.id]:
                    self._drop_left(holder_id, node.id)

    def _acquire_bulk_steps(
        self,
        batch: Sequence[tuple[Node, modes.Mode]],
        holder: dict[str, Any],
        request: LockRequest,
        deadline: float,
        gone: Mapping[str, list[list[Any]]] | None = None,
    ) -> Steps[list[dict[str, Any]]]:
        """Send ACQUIRE for ``batch`` in one ``_bulk``; return its items."""
        sent: dict[str, list[str]] = {}
        operations = self._acquire_items(batch, holder, request, gone, sent)
        items = yield from self._bulk_steps(operations, "acquire", retry_for=0, deadline=deadline)
        self._forget_pruned(sent, batch, items)
        return items

    def _take_steps(
        self,
        targets: Sequence[tuple[Node, modes.Mode]],
        holder: dict[str, Any],
        request: LockRequest,
        deadline: float,
    ) -> Steps[answers.AcquireOutcome]:
        """Take ``targets``: ``create`` where the node may be new, ACQUIRE where it exists; stop at the first refusal.

        A fresh node's ``create`` (see :mod:`.grants`) that finds the node
        existing (409, or a no-op of the scripted CREATE) goes to ACQUIRE in a
        second ``_bulk``, as does one the grant pipeline failed: nothing was
        written by it. A ``_bulk`` that also takes known nodes takes its
        fresh ones with the scripted CREATE.
        """
        yield from self._grant_pipeline_steps()
        targets = bottom_up(targets)  # see "Ancestors"
        with self._sole_lock:
            known = {t for t in targets if t[0].id in self._existing}
        # Elasticsearch 7.0 fails an upsert (ACQUIRE) through an alias in a _bulk that also names a pipeline
        # ("pipeline with id [null] does not exist"): a plain create only in a bulk of creates (see grants.py).
        plain = not known
        operations = []
        sent: dict[str, list[str]] = {}
        for node, mode in targets:
            if (node, mode) in known:
                operations += self._acquire_items([(node, mode)], holder, request, sent=sent)
            else:
                operations += self._fresh_item(node, mode, holder, request, plain=plain)
        items = yield from self._bulk_steps(operations, "acquire", retry_for=0, deadline=deadline)
        self._forget_pruned(sent, targets, items)
        existing = []
        answered = []
        created = []
        for target, item in zip(targets, items, strict=True):
            if target in known:
                answered.append((target, item))
                if answers.result(item) == "created":
                    self._note_existing([], [target[0]])
                continue
            found = answers.fresh_node_exists(item)
            if found is None:
                answered.append((target, item))
                created.append((target[0], item))
                if answers.result(item) == "created" and "create" in item:
                    self._pipeline_worked()
                continue
            existing.append(target)
            if found == "failed":
                self._pipeline_failed(answers.item_error(item))
        self._note_sole(request.holder_id, created)
        self._note_existing([n for n, _ in existing], [])
        outcome = answers.read_acquire_items(
            request, [i for _, i in answered], [t for t, _ in answered], max_holders=self.max_holders_per_node
        )
        if existing and not (outcome.refused or outcome.errors or outcome.busy):
            if any(modes.is_grant(mode) for _, mode in existing):
                # Its ancestors taken above are written again behind the main node (see "Ancestors").
                taken = set(outcome.taken)
                existing += [t for t in targets if t[0] in taken and not modes.is_grant(t[1])]
            existing = bottom_up(existing)
            items = yield from self._acquire_bulk_steps(existing, holder, request, deadline)
            outcome = answers.merge(
                outcome, answers.read_acquire_items(request, items, existing, max_holders=self.max_holders_per_node)
            )
        elif existing:
            outcome.refused.extend(node for node, _ in existing)  # not tried: the request failed already
        return outcome

    def _acquire_items(
        self,
        batch: Sequence[tuple[Node, modes.Mode]],
        holder: dict[str, Any],
        request: LockRequest,
        gone: Mapping[str, list[list[Any]]] | None = None,
        sent: dict[str, list[str]] | None = None,
    ) -> list[dict[str, Any]]:
        """Return the ``_bulk`` lines of ACQUIRE for ``batch``, asking for the holders back where they are read.

        ``gone``: per node id, ancestor entries shown to hold no more (see
        "Ancestors"); the entries this process left on a node go too, and
        are noted in ``sent`` (see :meth:`_forget_pruned`).
        """
        fields = ["lock_count"]  # a refusal by a full node is told apart (see refusal_reason)
        if request.reentrant or request.ticket is not None:  # its holder or marker (see read_acquire_items)
            fields += ["holders.id", "waiters.id"]
        if request.ticket is not None:  # its place in the queues (see queued_poll_interval)
            fields += ["waiters.ticket", "waiters.mode"]
        if request.holder_limit is not None:  # the limit that stands (see Grant.holder_limit)
            fields.append("holder_limit")
        # On a main node, the ancestor entries that may refuse it (see answers.suspects).
        main_fields = sorted({*fields, *answers.SUSPECT_FIELDS})
        operations = []
        for node, mode in batch:
            params = self._acquire_params(node, mode, holder, request)
            own = self._left_of(node)
            if own and sent is not None:
                sent[node.id] = list(own)
            params["gone"] = [[holder_id, None, owner] for holder_id, owner in own.items()]
            params["gone"] += (gone or {}).get(node.id, ())
            operations += self._scripted(
                node,
                scripts.ACQUIRE,
                params,
                fields=main_fields if modes.is_grant(mode) else fields,
                scripted_upsert=True,
                upsert={},
            )
        return operations

    def _acquire_params(
        self, node: Node, mode: modes.Mode, holder: dict[str, Any], request: LockRequest
    ) -> dict[str, Any]:
        params = {
            "holder": holder_entry(holder, mode, request),
            "conflicts": sorted(m.value for m in modes.conflicting(mode)),
            "reentrant": request.may_reenter(node),
            "ticket": request.ticket,
            "marker_ttl_ms": self._marker_ttl_ms(),
            "ttl_ms": request.ttl_ms,
            "node": node_fields(node),
            "max_holders": self.max_holders_per_node,
            "lock_delay_ms": self.lock_delay_ms,
            "holder_limit": request.holder_limit,
        }
        if request.ticket is not None:  # only a request that may wait leaves a marker
            params["waiter"] = marker_fields(request)
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
                if body.get("result") == "updated" and holder_ids == [holder_id] and not answers.markers(source):
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
        """The head of a queue polls as often as a poll takes to answer; the others every ``queued_poll_cap``,
        doubled for each request before them.

        Elasticsearch tells no one of a write, so a waiter learns of a release
        by its next try: the head of a queue pauses about one try's answer
        time (:data:`HEAD_POLL_FLOOR` at least, ``queued_poll_cap`` at most),
        so it is granted about one try after the release, and a store that
        answers slowly is polled less often. A refused poll writes nothing
        (see ACQUIRE) and reads its node from the translog. A realtime ``get``
        is no cheaper signal of a release: on 7.0 it refreshes the shard when
        the node changed since the last refresh (measured: 70 ms).
        """
        with self._sole_lock:
            _, ahead = self._blocked.get(request.holder_id, ((), 0))
        if ahead == 0:
            pause = min(self.queued_poll_cap, max(HEAD_POLL_FLOOR, self._acquire_rtt))
        else:
            pause = self.queued_poll_cap * 2 ** min(ahead, 16)
        return min(self._marker_ttl_ms() / 3000, pause)

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
        drive(self._withdraw_steps(request), self.perform)

    async def awithdraw(self, request: LockRequest) -> None:
        await adrive(self._withdraw_steps(request), self.aperform)

    def _withdraw_steps(self, request: LockRequest) -> Steps[None]:
        with self._sole_lock:
            self._blocked.pop(request.holder_id, None)
            self._full.pop(request.holder_id, None)
        params = {"holder_id": request.holder_id}
        operations = [op for node, _ in request.targets for op in self._scripted(node, scripts.WITHDRAW, params)]
        # Markers end on their own: a short try, as for the give-back of a failed acquire.
        yield from self._bulk_steps(
            operations, "withdraw waiting markers", deadline=time.monotonic() + QUIET_RELEASE_BOUND
        )

    def release(self, grant: Grant) -> bool:
        return drive(self._grant_release_steps(grant), self.perform)

    async def arelease(self, grant: Grant) -> bool:
        return await adrive(self._grant_release_steps(grant), self.aperform)

    def _grant_release_steps(self, grant: Grant) -> Steps[bool]:
        """Release ``grant``; its main nodes (S or X), where requests queue, get RELEASE behind their delete.

        Its entries on ancestors it shares stay behind (see "Ancestors").
        """
        request = grant.request
        mains = frozenset(node.id for node, mode in request.targets if modes.is_grant(mode))
        return self._release_steps(
            request.holder_id, request.owner.key, grant.taken, behind=mains, leave=self._may_leave(request)
        )

    def _release_steps(
        self,
        holder_id: str,
        owner_key: str | None,
        nodes: Sequence[Node],
        *,
        quiet: bool = False,
        behind: frozenset[str] = frozenset(),
        leave: frozenset[str] = frozenset(),
    ) -> Steps[bool]:
        """Remove ``holder_id`` (of ``owner_key``, or anyone's) from ``nodes``; True if it was on all.

        A node this holder created and that nobody wrote since is deleted
        outright (if ``_seq_no`` still matches); the others, and any such
        delete that fails, go through the RELEASE script. A node of
        ``behind`` (where a waiting request's marker is likely: the lock's
        main node) gets the RELEASE script in the same ``_bulk``, right behind
        its delete: it finds the node gone (404) when the delete took it, and
        releases it when a marker made the delete fail (measured on 7.0: 0.1 ms
        more per release, one round trip less per release someone waited
        for). A release resent after a lost answer (:meth:`_call_steps`) may
        find the holder gone by its own first send: then a missing holder does
        not count as lost. A node of ``leave`` (an ancestor) is not written
        unless this holder alone wrote it (the delete): its entry stays behind
        (see "Ancestors"), and so does one whose delete found the node changed.
        """
        sole = self._forget_sole(holder_id)
        left = [node for node in nodes if node.id in leave and node.id not in sole]
        nodes = [node for node in nodes if node not in left]
        if not nodes:
            self._note_left(holder_id, owner_key, left)
            return True
        # Quiet, the caller is failing already: a short try, and the lease ends what it leaves.
        retry_for = QUIET_RELEASE_RETRY if quiet else None
        deadline = time.monotonic() + (QUIET_RELEASE_BOUND if quiet else RELEASE_CALL_BOUND)
        params = {
            "holder_id": holder_id,
            "owner_key": owner_key,
            "tombstone_ms": RELEASE_TOMBSTONE_MS,
            "tombstones_kept": RELEASE_TOMBSTONES_KEPT,
            "lock_delay_ms": self.lock_delay_ms,
        }
        operations: list[dict[str, Any]] = []
        shapes: list[list[str]] = []  # per node: its items in this bulk (a delete, a RELEASE, or both)
        for node in nodes:
            shape: list[str] = []
            if node.id in sole:
                operations.append(delete_unchanged(self.index_of(node.namespace), node.id, *sole[node.id]))
                shape.append("delete")
            if node.id not in sole or node.id in behind:
                operations += self._scripted(node, scripts.RELEASE, params)
                shape.append("update")
            shapes.append(shape)
        resent: list[bool] = []
        try:
            first = yield from self._bulk_steps(
                operations, "release", retry_for=retry_for, resent=resent, deadline=deadline
            )
            answered = iter(first)
            per_node = [{verb: next(answered) for verb in shape} for shape in shapes]
            items = [standing_item(mine) for mine in per_node]
            changed = [
                node
                for node, item in zip(nodes, items, strict=True)
                if "delete" in item and answers.result(item) != "deleted"
            ]
            left += [node for node in changed if node.id in leave]
            changed = [node for node in changed if node.id not in leave]
            scripted = [(node, item) for node, item in zip(nodes, items, strict=True) if "update" in item]
            if changed:
                operations = [op for node in changed for op in self._scripted(node, scripts.RELEASE, params)]
                again = yield from self._bulk_steps(
                    operations, "release", retry_for=retry_for, resent=resent, deadline=deadline
                )
                scripted += zip(changed, again, strict=True)
        except LockBackendUnavailable:
            if quiet:
                return False  # the lease will end it; the caller is already failing
            raise
        self._note_left(holder_id, owner_key, left)
        deleted = [node for node, item in zip(nodes, items, strict=True) if answers.result(item) == "deleted"]
        self._note_existing([], deleted + [node for node, item in scripted if answers.result(item) == "deleted"])
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
            answer = yield from self._call_steps("read released lock nodes", StoreCall("mget", {"docs": docs}))
        except LockBackendUnavailable:
            return False  # unproven: reported lost
        return all(
            doc.get("found") and answers.released_here(doc.get("_source") or {}, holder_id, owner_key)
            for doc in answer["docs"]
        )

    def _left_behind_steps(self, sources: Sequence[Mapping[str, Any]]) -> Steps[set[tuple[str, str]]]:
        """Return (node id, holder id) of the ancestor entries in ``sources`` whose holder is not on its main node.

        For listings and the waiting state, which show who holds: an entry
        left behind (see "Ancestors") holds nothing. The main nodes are read
        with a realtime ``mget``; one that cannot be read keeps its entries.
        """
        where: dict[str, str] = {}  # main node id -> its lock index
        for source in sources:
            for h in source.get("holders") or ():
                if h.get("main") and not modes.is_grant(h["mode"]):
                    where[h["main"]] = self.index_of(source["namespace"])
        if not where:
            return set()
        docs = [
            {"_index": index, "_id": main, "_source": {"includes": ["holders.id"]}} for main, index in where.items()
        ]
        read = StoreCall("mget", {"docs": docs, "realtime": True})
        answer = yield from self._call_steps("read the main nodes of ancestor entries", read)
        holding: dict[str, set[str]] = {}
        for main, doc in zip(where, answer["docs"], strict=True):
            if "error" not in doc:
                holding[main] = {h["id"] for h in (doc.get("_source") or {}).get("holders") or ()}
        return {
            (Node(source["namespace"], Kind(source["kind"]), source["key"]).id, h["id"])
            for source in sources
            for h in source.get("holders") or ()
            if h.get("main") in holding and not modes.is_grant(h["mode"]) and h["id"] not in holding[h["main"]]
        }

    def renew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> bool:
        return _renewed_or_busy(drive(self._renew_steps([grant], checkpoint, recovery, timeout), self.perform))

    async def arenew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> bool:
        return _renewed_or_busy(await adrive(self._renew_steps([grant], checkpoint, recovery, timeout), self.aperform))

    def renew_many(self, grants: Sequence[Grant], *, timeout: float | None = None) -> list[bool | None]:
        return [renewed for renewed, _ in drive(self._renew_steps(grants, None, None, timeout), self.perform)]

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

    def wait_state(self, nodes: Sequence[Node] | None = None) -> WaitState:
        return drive(self._wait_state_steps(nodes), self.perform)

    async def await_state(self, nodes: Sequence[Node] | None = None) -> WaitState:
        return await adrive(self._wait_state_steps(nodes), self.aperform)

    def _wait_state_steps(self, nodes: Sequence[Node] | None) -> Steps[WaitState]:
        """Read nodes with live markers (a search after a refresh), or ``nodes`` as they are now (a realtime mget).

        Liveness is judged against the clock of the node that answers a
        ``_nodes/_local/stats`` read just before: a store clock, as the
        listing's ``now``. Reads only: a missing lock index is no waiting.
        """
        stats = StoreCall("nodes.stats", {"node_id": "_local", "metric": "process", "filter_path": "nodes.*.timestamp"})
        now_ms = next(iter((yield from self._call_steps("read the store's clock", stats))["nodes"].values()))[
            "timestamp"
        ]
        sources: list[Mapping[str, Any]] = []
        if nodes is None:
            indices = ",".join(self.lock_indices)
            refresh = StoreCall("indices.refresh", {"index": indices, "ignore_unavailable": True})
            yield from self._call_steps("refresh the lock index", refresh)
            body: dict[str, Any] = {
                "query": {"range": {"waiting_until": {"gt": now_ms}}},
                "sort": SORT,
                "size": self.page_size,
                "_source": ["namespace", "kind", "key", "holders", "waiters"],
                "track_total_hits": False,
            }
            while True:
                search = StoreCall("search", {"index": indices, "ignore_unavailable": True, **body})
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
                mget = StoreCall(
                    "mget", {"index": index, "ids": sorted(set(ids)), "realtime": True}, options={"ignore_status": 404}
                )
                docs = (yield from self._call_steps("read waiting requests", mget)).get("docs", ())
                sources.extend(doc["_source"] for doc in docs if doc.get("found"))
        marked = [source for source in sources if answers.markers(source)]
        return answers.wait_state_of(sources, now_ms, left=(yield from self._left_behind_steps(marked)))
