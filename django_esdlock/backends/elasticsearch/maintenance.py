"""Maintenance of the Elasticsearch lock store: listing holders page by page, eviction, take-over, forced release.

What the admin, ``reap_locks``, hand-off and recovery ask of the store, apart
from the lock protocol they do not take part in; as steps, like the protocol.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ... import modes
from ...records import Grant, HolderPage, HolderRecord, Kind, Node, Owner
from ...steps import Steps, drive
from ..base import expires_ms, takeover_request
from . import answers, scripts
from .protocol import SORT, delete_unchanged
from .transport import StoreCall

STALE_MARGIN_S = 2
"""Seconds past ``grace`` after which the reaper deletes a node of expired holders outright, without EVICT.

The search's ``now`` is the clock of the node that coordinates it, not of
the primary shard that stamped the lease: the margin absorbs skew between
the two (and the rounding of ``grace`` to seconds).
"""

Hit = dict[str, Any]
"""A search hit: a lock node's ``_source`` with its ``_id``, ``_index``, ``_seq_no``, ``_primary_term``."""


def _encode_cursor(sort_values: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(sort_values).encode()).decode()


def _decode_cursor(cursor: str) -> list[Any]:
    try:
        return json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except ValueError as e:
        raise ValueError(f"not a holder page cursor: {cursor!r}") from e


def expired_query(grace: float, margin: int = 0) -> dict[str, Any]:
    """Match holders expired for at least ``grace`` (plus ``margin``) seconds, by the store's clock (``now``).

    Date math has no millisecond unit, so the grace is cut to whole seconds:
    the query may match a little early, and the EVICT script, which compares
    ``ctx._now`` to the millisecond, has the last word.
    """
    seconds = math.floor(max(0.0, grace)) + margin
    return {"range": {"holders.expires_at": {"lte": f"now-{seconds}s" if seconds else "now"}}}


def _appending(found: list[Any]) -> Callable[[list[Any]], Steps[None]]:
    """Return a page handler (see :meth:`Maintenance._search_steps`) that appends each page to ``found``."""

    def append(page: list[Any]) -> Steps[None]:
        found.extend(page)
        yield from ()

    return append


class Maintenance:
    """Listing and maintenance of an :class:`~django_esdlock.backends.elasticsearch.ElasticsearchLockBackend`.

    A mixin of the backend: it searches the lock indices a page
    (``page_size`` nodes) at a time and writes through the protocol's scripts.
    """

    def _refresh_steps(self, namespace: str | None = None) -> Steps[None]:
        indices = self._indices_of(namespace)
        refresh = StoreCall("indices.refresh", {"index": indices, "ignore_unavailable": True})
        yield from self._call_steps("refresh the lock index", refresh)

    def _index_exists_steps(self, namespace: str | None = None) -> Steps[bool]:
        """Return whether the lock index of ``namespace`` exists (any lock index, for None)."""
        indices = [self.index_of(namespace)] if namespace is not None else self.lock_indices
        for index in indices:
            if (yield from self._call_steps("look up the lock index", StoreCall("indices.exists", {"index": index}))):
                return True
        return False

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
        steps = self._holders_steps(namespace, path_prefix, cursor, limit, mode, host, expired, parent)
        return drive(steps, self.perform)

    def _holders_steps(
        self,
        namespace: str | None,
        path_prefix: str | None,
        cursor: str | None,
        limit: int,
        mode: modes.Mode | None,
        host: str | None,
        expired: bool | None,
        parent: str | None,
    ) -> Steps[HolderPage]:
        if not (yield from self._index_exists_steps(namespace)):
            return HolderPage([], None)
        yield from self._refresh_steps(namespace)
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
        body: dict[str, Any] = {"query": {"bool": {"filter": filters}}, "sort": SORT, "size": limit}
        if cursor:
            body["search_after"] = _decode_cursor(cursor)
        records: list[HolderRecord] = []
        shown = 0  # nodes with a holder on this page: a node whose entries were all left behind shows none
        while True:
            search = StoreCall("search", {"index": self._indices_of(namespace), "ignore_unavailable": True, **body})
            hits = (yield from self._call_steps("list holders", search))["hits"]["hits"]
            left = yield from self._left_behind_steps([hit["_source"] for hit in hits])
            for hit in hits:
                inner = hit.get("inner_hits", {}).get("match")
                matched = [h["_source"] for h in inner["hits"]["hits"]] if inner else None
                found = answers.without_left(answers.records(hit["_source"], matched), left)
                if found:
                    records.extend(found)
                    shown += 1
                if shown == limit:
                    return HolderPage(records, _encode_cursor(hit["sort"]))
            if len(hits) < limit:
                return HolderPage(records, None)
            body["search_after"] = hits[-1]["sort"]  # the page is short of nodes that hold: read on

    def node_holders(self, node: Node) -> list[HolderRecord]:
        return drive(self._node_holders_steps(node), self.perform)

    def _node_holders_steps(self, node: Node) -> Steps[list[HolderRecord]]:
        if not (yield from self._index_exists_steps(node.namespace)):
            return []
        get = StoreCall("get", {"index": self.index_of(node.namespace), "id": node.id}, options={"ignore_status": 404})
        response = yield from self._call_steps("read a lock node", get)
        if not response.get("found"):
            return []
        left = yield from self._left_behind_steps([response["_source"]])
        return answers.without_left(answers.records(response["_source"]), left)

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
        return drive(self._evict_expired_steps(namespace, grace, dry_run, progress), self.perform)

    def _evict_expired_steps(
        self, namespace: str | None, grace: float, dry_run: bool, progress: Callable[[int], None] | None
    ) -> Steps[list[HolderRecord]]:
        evicted: list[HolderRecord] = []

        def delete_stale(hits: list[Hit]) -> Steps[None]:
            evicted.extend((yield from self._delete_stale_steps(hits)))
            if progress is not None:
                progress(len(evicted))

        def evict(found: list[HolderRecord]) -> Steps[None]:
            if dry_run:
                evicted.extend(found)
            elif found:
                evicted.extend((yield from self._evict_steps(found, max(0, round(grace * 1000)))))
            if progress is not None:
                progress(len(evicted))

        if not dry_run:
            live = {
                "nested": {"path": "holders", "query": {"bool": {"must_not": expired_query(grace, STALE_MARGIN_S)}}}
            }
            stale = {"path": "holders", "query": expired_query(grace, STALE_MARGIN_S)}
            yield from self._search_steps(stale, delete_stale, namespace=namespace, must_not=live, inner_hits=False)
        yield from self._holder_pages_steps(expired_query(grace), evict, namespace=namespace, keep=answers.evictable)
        return evicted

    def _delete_stale_steps(self, hits: list[Hit]) -> Steps[list[HolderRecord]]:
        """Delete the nodes of ``hits`` (all holders stale) that carry no intent and no marker, if unchanged."""
        chosen = [
            hit
            for hit in hits
            if not answers.markers(hit["_source"])
            and not any(answers.awaits_recovery(h) for h in hit["_source"]["holders"])
        ]
        if not chosen:
            return []
        yield from self._ensure_index_steps()
        with self._sole_lock:
            current = set(self._current.values())
        # Through the alias, and only from the incarnation it names: sequence numbers start over in another.
        chosen = [hit for hit in chosen if hit["_index"] in current]
        operations = [
            delete_unchanged(
                self.index_of(hit["_source"]["namespace"]), hit["_id"], hit["_seq_no"], hit["_primary_term"]
            )
            for hit in chosen
        ]
        # Read before the deletes (which may take a main node): entries whose holder had let go are not reported.
        left = yield from self._left_behind_steps([hit["_source"] for hit in chosen])
        items = yield from self._bulk_steps(operations, "evict expired holders")
        deleted = [hit["_source"] for hit, item in zip(chosen, items, strict=True) if answers.result(item) == "deleted"]
        return answers.without_left([r for source in deleted for r in answers.records(source)], left)

    def _evict_steps(self, found: list[HolderRecord], grace_ms: int) -> Steps[list[HolderRecord]]:
        """Run EVICT on the nodes of ``found``; delete the nodes it left empty, if nobody wrote them since."""
        by_node: dict[Node, list[HolderRecord]] = {}
        for record in found:
            by_node.setdefault(record.node, []).append(record)
        params = {"grace_ms": grace_ms}
        fields = ["holders.id", "waiters.id", "waiters.released"]
        operations = [op for node in by_node for op in self._scripted(node, scripts.EVICT, params, fields=fields)]
        items = yield from self._bulk_steps(operations, "evict expired holders")
        evicted: list[HolderRecord] = []
        emptied: list[dict[str, Any]] = []
        for (node, records), item in zip(by_node.items(), items, strict=True):
            body = item["update"]
            if body.get("result") != "updated":
                continue
            source = body.get("get", {}).get("_source") or {}
            left = {h["id"] for h in source.get("holders") or ()}
            evicted.extend(r for r in records if r.holder_id not in left)
            if not left and not answers.markers(source):
                index = self.index_of(node.namespace)
                emptied.append(delete_unchanged(index, node.id, body["_seq_no"], body["_primary_term"]))
        if emptied:
            # A 409 means someone took the node since: keep it.
            yield from self._bulk_steps(emptied, "delete emptied lock nodes")
        return evicted

    def _search_steps(
        self,
        nested: dict[str, Any],
        each: Callable[[list[Hit]], Steps[None]],
        *,
        namespace: str | None = None,
        must_not: dict[str, Any] | None = None,
        inner_hits: bool = True,
    ) -> Steps[None]:
        """Hand ``each``, page by page, the hits of nodes with a holder matching the ``nested`` query.

        The matching holders come as inner hits "match" unless ``inner_hits``
        is False; ``must_not`` excludes nodes. Hits carry ``_seq_no`` and
        ``_primary_term``. A page is read after ``each`` is done with the one
        before: one page of nodes in memory at a time.
        """
        if not (yield from self._index_exists_steps(namespace)):
            return
        yield from self._refresh_steps(namespace)
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
            "sort": SORT,
            "size": self.page_size,
            "seq_no_primary_term": True,
            "track_total_hits": False,
        }
        while True:
            search = StoreCall("search", {"index": self._indices_of(namespace), "ignore_unavailable": True, **body})
            hits = (yield from self._call_steps("search holders", search))["hits"]["hits"]
            if hits:
                yield from each(hits)
            if len(hits) < self.page_size:
                return
            body["search_after"] = hits[-1]["sort"]

    def _holder_pages_steps(
        self,
        nested_query: dict[str, Any],
        each: Callable[[list[HolderRecord]], Steps[None]],
        *,
        namespace: str | None = None,
        keep: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> Steps[None]:
        """Hand ``each``, page by page, the holders matching ``nested_query`` (by inner hits) that ``keep`` accepts."""

        def records_of(hits: list[Hit]) -> Steps[None]:
            left = yield from self._left_behind_steps([hit["_source"] for hit in hits])
            yield from each(
                answers.without_left([record for hit in hits for record in answers.hit_records(hit, keep)], left)
            )

        yield from self._search_steps({"path": "holders", "query": nested_query}, records_of, namespace=namespace)

    def holder_records(self, holder_id: str) -> list[HolderRecord]:
        found: list[HolderRecord] = []
        drive(self._holder_pages_steps({"term": {"holders.id": holder_id}}, _appending(found)), self.perform)
        return found

    def expired_with_intent(self, *, namespace: str | None = None, grace: float = 0.0) -> list[HolderRecord]:
        found: list[HolderRecord] = []
        pages = self._holder_pages_steps(
            expired_query(grace), _appending(found), namespace=namespace, keep=answers.awaits_recovery
        )
        drive(pages, self.perform)
        return found

    def force_release(self, holder_id: str, nodes: Sequence[Node]) -> bool:
        return drive(self._release_steps(holder_id, None, nodes), self.perform)

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
        steps = self._take_over_steps(records, owner, ttl, recovery, require_expired, require_live, require_unchanged)
        return drive(steps, self.perform)

    def _take_over_steps(
        self,
        records: Sequence[HolderRecord],
        owner: Owner,
        ttl: float,
        recovery: dict[str, Any] | None,
        require_expired: bool,
        require_live: bool,
        require_unchanged: bool,
    ) -> Steps[Grant | None]:
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
        (item,) = yield from self._bulk_steps(
            operations([arbiter], arbiter.owner.get("key"), lease), "take a holder over"
        )
        if item["update"].get("result") != "updated":
            return None
        token = answers.token(item["update"])
        others = [r for r in records if r is not arbiter]
        if others:
            for item in (yield from self._bulk_steps(operations(others, None), "take a holder over")):
                if item["update"].get("result") == "updated":
                    token = max(token, answers.token(item["update"]))
        return Grant(request=request, token=token, taken=tuple(r.node for r in records))
