"""Elasticsearch lock store: the chapter's lock documents, one per node, holders inside."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import inspect
import json
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .. import modes, paths
from ..exceptions import LockBackendUnavailable
from ..records import Grant, HolderPage, HolderRecord, Kind, LockRequest, Node, Owner, from_epoch_ms
from . import elasticsearch_scripts as scripts
from .base import BaseLockBackend, takeover_request

try:
    import elasticsearch
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImproperlyConfigured(
        "The Elasticsearch lock backend needs the 'elasticsearch' package: pip install 'django-esdlock[elasticsearch]'"
    ) from e

MAPPING_VERSION = 1

_OWNER = {
    "properties": {
        "host": {"type": "keyword"},
        "pid": {"type": "long"},
        "thread": {"type": "keyword"},
        "thread_name": {"type": "keyword"},
        "process": {"type": "keyword"},
        "started": {"type": "keyword"},
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
                "intent": {"type": "object", "enabled": False},
                "checkpoint": {"type": "object", "enabled": False},
                "recovery": {"type": "object", "enabled": False},
            },
        },
        # Markers of requests that waited (fair waiting); read by scripts only.
        "waiters": {"type": "object", "enabled": False},
    },
}

# One primary shard: every write of a request lands on one shard, in order, and
# its `_seq_no` (our fencing token) is one sequence for the whole lock index.
INDEX_SETTINGS: dict[str, Any] = {"number_of_shards": 1, "auto_expand_replicas": "0-1"}

RETRY_ON_CONFLICT = 10
"""A real cluster answers 409 to concurrent updates of one node; retry on the shard."""

_SORT = [{"namespace": "asc"}, {"kind": "asc"}, {"key": "asc"}]
_CONTENTION = frozenset({"version_conflict_engine_exception", "es_rejected_execution_exception"})
_CLIENT_OPTIONS = frozenset(inspect.signature(elasticsearch.Elasticsearch.__init__).parameters) - {"self", "hosts"}


class _ItemError(Exception):
    """A bulk item failed for a reason other than contention."""


@dataclasses.dataclass
class AcquireOutcome:
    """How a bulk acquire went, read from its items (see :func:`read_acquire_items`)."""

    taken: list[Node]
    refused: list[Node]
    errors: list[str]
    token: int


def _own_hold(source: Mapping[str, Any] | None, owner_key: str, mode: str) -> bool:
    for holder in (source or {}).get("holders") or ():
        if holder.get("owner", {}).get("key") == owner_key and holder.get("mode") == mode:
            return True
    return False


def _holds(source: Mapping[str, Any] | None, holder_id: str) -> bool:
    return any(holder.get("id") == holder_id for holder in (source or {}).get("holders") or ())


def read_acquire_items(request: LockRequest, items: Sequence[Mapping[str, Any]]) -> AcquireOutcome:
    """Sort the items of an acquire ``_bulk`` into taken, refused and failed nodes.

    ``created``/``updated`` took the node. ``noop`` is a refusal, except for a
    reentrant request whose node this owner holds already. A 409 (concurrent
    update or two upserts racing to create the node, after retry_on_conflict)
    or 429 wrote nothing: a refusal to retry, never a grant. The token is the
    highest ``_seq_no`` written, plus one (so the first token is 1): it exceeds
    the token of every grant released before any of these writes.
    """
    outcome = AcquireOutcome([], [], [], 0)
    for (node, mode), item in zip(request.targets, items, strict=True):
        body = next(iter(item.values()))
        error = body.get("error")
        if error:
            if body.get("status") in (409, 429) or error.get("type") in _CONTENTION:
                outcome.refused.append(node)
            else:
                outcome.errors.append(f"{node}: {error.get('type')}: {error.get('reason')}")
            continue
        result = body.get("result")
        source = body.get("get", {}).get("_source")
        if result in ("created", "updated") and request.ticket is not None and not _holds(source, request.holder_id):
            outcome.refused.append(node)  # it left a waiting marker, not a holder
        elif result in ("created", "updated"):
            outcome.taken.append(node)
            outcome.token = max(outcome.token, body["_seq_no"] + 1)
        elif (
            result == "noop"
            and request.reentrant
            and _own_hold(body.get("get", {}).get("_source"), request.owner.key, mode)
        ):
            outcome.token = max(outcome.token, body.get("_seq_no", -1) + 1)
        elif result == "noop":
            outcome.refused.append(node)
        else:
            outcome.errors.append(f"{node}: unexpected result {result!r}")
    return outcome


def _encode_cursor(sort_values: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(sort_values).encode()).decode()


def _decode_cursor(cursor: str) -> list[Any]:
    try:
        return json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except ValueError as e:
        raise ValueError(f"not a holder page cursor: {cursor!r}") from e


def _records(source: Mapping[str, Any], holders: Sequence[Mapping[str, Any]] | None = None) -> list[HolderRecord]:
    node = Node(source["namespace"], Kind(source["kind"]), source["key"])
    return [
        HolderRecord(
            node=node,
            mode=modes.Mode(h["mode"]),
            holder_id=h["id"],
            owner=h.get("owner", {}),
            token=h.get("token"),
            acquired_at=from_epoch_ms(h.get("acquired_at")),
            expires_at=from_epoch_ms(h["expires_at"]),
            intent=h.get("intent"),
            checkpoint=h.get("checkpoint"),
            recovery=h.get("recovery"),
        )
        for h in (source.get("holders") or [] if holders is None else holders)
    ]


def _expired_query(grace: float) -> dict[str, Any]:
    """Match holders expired for at least ``grace`` seconds, by the store's clock (``now``).

    Date math has no millisecond unit, so the grace is cut to whole seconds:
    the query may match a little early, and the EVICT script, which compares
    ``ctx._now`` to the millisecond, has the last word.
    """
    seconds = math.floor(max(0.0, grace))
    return {"range": {"holders.expires_at": {"lte": f"now-{seconds}s" if seconds else "now"}}}


class ElasticsearchLockBackend(BaseLockBackend):
    """Locks as documents of one Elasticsearch index, as the chapter builds them.

    OPTIONS: ``hosts`` (default ``["http://127.0.0.1:9200"]``), ``index``
    (default ``"locks"``) and any keyword of ``elasticsearch.Elasticsearch``
    (``basic_auth``, ``api_key``, ``ca_certs``, ``verify_certs``,
    ``request_timeout``, ...), passed through to the client.
    """

    def __init__(
        self,
        *,
        ttl: float = 30.0,
        hosts: Sequence[str] | str = ("http://127.0.0.1:9200",),
        index: str = "locks",
        **client_options: Any,
    ) -> None:
        super().__init__(ttl=ttl)
        unknown = set(client_options) - _CLIENT_OPTIONS
        if unknown:
            raise ImproperlyConfigured(
                f"ElasticsearchLockBackend got unknown OPTIONS {', '.join(sorted(unknown))}; "
                "use 'hosts', 'index' or a keyword of elasticsearch.Elasticsearch"
            )
        if not isinstance(index, str) or not index or index != index.lower() or index.startswith(("_", "-", "+")):
            raise ImproperlyConfigured(
                f"ElasticsearchLockBackend OPTIONS['index'] is not a valid index name: {index!r}"
            )
        self.hosts = [hosts] if isinstance(hosts, str) else list(hosts)
        self.index = index
        self.client_options = client_options
        self._index_ready = False
        self._setup_lock = threading.Lock()
        self._client: elasticsearch.Elasticsearch | None = None
        self._client_pid: int | None = None

    def describe(self) -> str:
        return f"Elasticsearch {', '.join(self.hosts)} index {self.index!r}"

    # --- connection -------------------------------------------------------

    @property
    def client(self) -> elasticsearch.Elasticsearch:
        """The client of this process: a forked child opens its own connections."""
        if self._client is None or self._client_pid != os.getpid():
            self._client = elasticsearch.Elasticsearch(self.hosts, **self.client_options)
            self._client_pid = os.getpid()
        return self._client

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._client_pid == os.getpid():
            client.close()

    @contextlib.contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """Turn client and transport failures into LockBackendUnavailable."""
        try:
            yield
        except (elasticsearch.ApiError, elasticsearch.TransportError) as e:
            raise LockBackendUnavailable(f"Elasticsearch failed to {action} ({self.describe()}): {e}") from e

    def setup(self) -> None:
        """Create the lock index with its strict mapping unless it exists."""
        with self._translate("create the lock index"):
            if not self.client.indices.exists(index=self.index):
                try:
                    self.client.indices.create(index=self.index, settings=INDEX_SETTINGS, mappings=MAPPING)
                except elasticsearch.BadRequestError as e:
                    if e.error != "resource_already_exists_exception":
                        raise
        self._index_ready = True

    def _ensure_index(self) -> None:
        # Before the first write: an update would otherwise auto-create the
        # index with a dynamic mapping.
        if not self._index_ready:
            with self._setup_lock:
                if not self._index_ready:
                    self.setup()

    def _scripted(
        self, node_id: str, source: str, params: dict[str, Any], *, fields: list[str] | None = None, **body: Any
    ) -> list[dict[str, Any]]:
        """Return the two ``_bulk`` lines of a scripted update of one node, retried on conflict.

        ``fields`` asks for those source fields back; ``body`` adds to the
        update (``scripted_upsert``, ``upsert``).
        """
        header: dict[str, Any] = {"_index": self.index, "_id": node_id, "retry_on_conflict": RETRY_ON_CONFLICT}
        if fields:
            header["_source"] = fields
        return [{"update": header}, {"script": {"source": source, "lang": "painless", "params": params}, **body}]

    def _bulk(self, operations: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
        with self._translate(action):
            return self.client.bulk(operations=operations)["items"]

    # --- the primitive ------------------------------------------------------

    def acquire(self, request: LockRequest) -> Grant | None:
        self._ensure_index()
        holder = {"id": request.holder_id, "owner": request.owner.as_dict()}
        if request.intent is not None:
            holder["intent"] = request.intent
        fields = ["holders.id", "holders.owner.key", "holders.mode"]
        fields_back = fields if request.reentrant or request.ticket is not None else None
        operations: list[dict[str, Any]] = []
        for node, mode in request.targets:
            parent = paths.parent(node.key) if node.kind is Kind.TREE else None
            params = {
                "holder": {**holder, "mode": mode.value},
                "conflicts": sorted(m.value for m in modes.conflicting(mode)),
                "reentrant": request.reentrant,
                "ticket": request.ticket,
                "marker_ttl_ms": round(self.marker_ttl * 1000),
                "ttl_ms": request.ttl_ms,
                "node": {
                    "namespace": node.namespace,
                    "kind": node.kind.value,
                    "key": node.key,
                    "parent": parent,
                    "depth": node.key.count("/") if node.kind is Kind.TREE else 0,
                },
            }
            operations += self._scripted(
                node.id, scripts.ACQUIRE, params, fields=fields_back, scripted_upsert=True, upsert={}
            )
        try:
            items = self._bulk(operations, "acquire")
        except LockBackendUnavailable:
            # The bulk may have been applied in part: give back whatever it took.
            self._release_nodes(request.holder_id, request.owner.key, [n for n, _ in request.targets], quiet=True)
            raise
        outcome = read_acquire_items(request, items)
        if outcome.errors or outcome.refused:
            self._release_nodes(request.holder_id, request.owner.key, outcome.taken, quiet=bool(outcome.errors))
            if outcome.errors:
                raise LockBackendUnavailable(f"Elasticsearch refused the acquire: {'; '.join(outcome.errors)}")
            return None
        return Grant(request=request, token=outcome.token, taken=tuple(outcome.taken))

    def withdraw(self, request: LockRequest) -> None:
        params = {"holder_id": request.holder_id}
        operations = [op for node, _ in request.targets for op in self._scripted(node.id, scripts.WITHDRAW, params)]
        self._bulk(operations, "withdraw waiting markers")

    def release(self, grant: Grant) -> bool:
        return self._release_nodes(grant.request.holder_id, grant.request.owner.key, grant.taken)

    def force_release(self, holder_id: str, nodes: Sequence[Node]) -> bool:
        return self._release_nodes(holder_id, None, nodes)

    def _release_nodes(
        self, holder_id: str, owner_key: str | None, nodes: Sequence[Node], *, quiet: bool = False
    ) -> bool:
        """Remove ``holder_id`` (of ``owner_key``, or anyone's) from ``nodes``; True if it was on all."""
        if not nodes:
            return True
        params = {"holder_id": holder_id, "owner_key": owner_key}
        operations = [op for node in nodes for op in self._scripted(node.id, scripts.RELEASE, params)]
        try:
            items = self._bulk(operations, "release")
        except LockBackendUnavailable:
            if quiet:
                return False  # the lease will end it; the caller is already failing
            raise
        all_there = True
        failures = []
        for node, item in zip(nodes, items, strict=True):
            body = item["update"]
            if body.get("result") in ("updated", "deleted"):
                continue
            all_there = False
            if body.get("status") not in (None, 200, 404):
                failures.append(f"{node}: {body.get('error')}")
        if failures and not quiet:
            raise LockBackendUnavailable(f"Elasticsearch failed to release: {'; '.join(failures)}")
        return all_there

    def renew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
    ) -> bool:
        params = {
            "holder_id": grant.request.holder_id,
            "owner_key": grant.request.owner.key,
            "ttl_ms": grant.request.ttl_ms,
            "token": grant.token,
            "checkpoint": checkpoint,
            "recovery": recovery,
        }
        operations = [op for node in grant.taken for op in self._scripted(node.id, scripts.RENEW, params)]
        if not operations:
            return True
        items = self._bulk(operations, "renew")
        transient = [i["update"] for i in items if i["update"].get("status") in (409, 429)]
        if transient:
            raise LockBackendUnavailable(f"Elasticsearch was too busy to renew: {transient[0].get('error')}")
        return all(item["update"].get("result") == "updated" for item in items)

    # --- inspection and maintenance -------------------------------------------

    def _refresh(self) -> None:
        with self._translate("refresh the lock index"):
            self.client.indices.refresh(index=self.index)

    def _index_exists(self) -> bool:
        with self._translate("look up the lock index"):
            return bool(self.client.indices.exists(index=self.index))

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
        if not self._index_exists():
            return HolderPage([], None)
        self._refresh()
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
        with self._translate("list holders"):
            hits = self.client.search(index=self.index, **body)["hits"]["hits"]
        records = []
        for hit in hits:
            inner = hit.get("inner_hits", {}).get("match")
            records.extend(_records(hit["_source"], [h["_source"] for h in inner["hits"]["hits"]] if inner else None))
        next_cursor = _encode_cursor(hits[-1]["sort"]) if len(hits) == limit else None
        return HolderPage(records, next_cursor)

    def node_holders(self, node: Node) -> list[HolderRecord]:
        if not self._index_exists():
            return []
        with self._translate("read a lock node"):
            response = self.client.options(ignore_status=404).get(index=self.index, id=node.id)
        return _records(response["_source"]) if response.get("found") else []

    def evict_expired(
        self,
        *,
        namespace: str | None = None,
        grace: float = 0.0,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> list[HolderRecord]:
        evicted: list[HolderRecord] = []
        for page in self._holder_pages(_expired_query(grace), namespace=namespace):
            found = [r for r in page if not r.intent]
            if dry_run:
                evicted.extend(found)
            elif found:
                evicted.extend(self._evict(found, max(0, round(grace * 1000))))
            if progress is not None:
                progress(len(evicted))
        return evicted

    def _evict(self, found: list[HolderRecord], grace_ms: int) -> list[HolderRecord]:
        by_node: dict[str, list[HolderRecord]] = {}
        for record in found:
            by_node.setdefault(record.node.id, []).append(record)
        params = {"grace_ms": grace_ms}
        operations = [
            op for node_id in by_node for op in self._scripted(node_id, scripts.EVICT, params, fields=["holders.id"])
        ]
        items = self._bulk(operations, "evict expired holders")
        evicted: list[HolderRecord] = []
        for records, item in zip(by_node.values(), items, strict=True):
            body = item["update"]
            if body.get("result") == "deleted":
                evicted.extend(records)
            elif body.get("result") == "updated":
                left = {h["id"] for h in body.get("get", {}).get("_source", {}).get("holders", [])}
                evicted.extend(r for r in records if r.holder_id not in left)
        return evicted

    def _holder_pages(
        self, nested_query: dict[str, Any], *, namespace: str | None = None
    ) -> Iterator[list[HolderRecord]]:
        """Yield, page by page, the holders matching ``nested_query`` (by inner hits)."""
        if not self._index_exists():
            return
        self._refresh()
        filters: list[dict[str, Any]] = [
            {"nested": {"path": "holders", "query": nested_query, "inner_hits": {"size": 100, "name": "match"}}}
        ]
        if namespace is not None:
            filters.append({"term": {"namespace": namespace}})
        body: dict[str, Any] = {"query": {"bool": {"filter": filters}}, "sort": _SORT, "size": self.page_size}
        while True:
            with self._translate("search holders"):
                hits = self.client.search(index=self.index, **body)["hits"]["hits"]
            if not hits:
                return
            yield [
                record
                for hit in hits
                for record in _records(
                    hit["_source"], [h["_source"] for h in hit["inner_hits"]["match"]["hits"]["hits"]]
                )
            ]
            body["search_after"] = hits[-1]["sort"]

    def holder_records(self, holder_id: str) -> list[HolderRecord]:
        return [r for page in self._holder_pages({"term": {"holders.id": holder_id}}) for r in page]

    def expired_with_intent(self, *, namespace: str | None = None, grace: float = 0.0) -> list[HolderRecord]:
        pages = self._holder_pages(_expired_query(grace), namespace=namespace)
        return [r for page in pages for r in page if r.intent]

    def take_over(
        self,
        records: Sequence[HolderRecord],
        owner: Owner,
        *,
        ttl: float,
        recovery: dict[str, Any],
        require_expired: bool = True,
    ) -> Grant | None:
        records, arbiter, request = takeover_request(records, owner, ttl)
        params = {
            "holder_id": arbiter.holder_id,
            "owner": owner.as_dict(),
            "ttl_ms": request.ttl_ms,
            "recovery": recovery,
            "require_expired": require_expired,
        }

        def operations(batch: Sequence[HolderRecord], expected_owner_key: str | None) -> list[dict[str, Any]]:
            script_params = {**params, "expected_owner_key": expected_owner_key}
            return [op for r in batch for op in self._scripted(r.node.id, scripts.TAKE_OVER, script_params)]

        # The arbiter alone first: whoever updates it owns the recovery.
        (item,) = self._bulk(operations([arbiter], arbiter.owner.get("key")), "take a holder over")
        if item["update"].get("result") != "updated":
            return None
        token = item["update"]["_seq_no"] + 1
        others = [r for r in records if r is not arbiter]
        if others:
            for item in self._bulk(operations(others, None), "take a holder over"):
                if item["update"].get("result") == "updated":
                    token = max(token, item["update"]["_seq_no"] + 1)
        return Grant(request=request, token=token, taken=tuple(r.node for r in records))

    # --- checks ---------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        try:
            with self._translate("reach the cluster"):
                client = self.client.options(request_timeout=5)
                if not client.indices.exists(index=self.index):
                    return []  # created with the right mapping on first use
                mapping = client.indices.get_mapping(index=self.index)
                settings = client.indices.get_settings(index=self.index)
        except LockBackendUnavailable as e:
            return [
                checks.Error(
                    str(e),
                    hint="Start Elasticsearch or fix LOCK_BACKEND['OPTIONS']['hosts'].",
                    id="django_esdlock.E002",
                )
            ]
        errors = []
        actual = next(iter(mapping.values()))["mappings"]
        if actual.get("dynamic") not in ("strict", False) or actual.get("properties") != MAPPING["properties"]:
            errors.append(
                checks.Error(
                    f"Elasticsearch index {self.index!r} has a mapping that is not django-esdlock's lock mapping.",
                    hint="Point OPTIONS['index'] at a new index name, or delete the index when no lock is held.",
                    id="django_esdlock.E003",
                )
            )
        shards = next(iter(settings.values()))["settings"]["index"].get("number_of_shards")
        if str(shards) != "1":
            errors.append(
                checks.Error(
                    f"Elasticsearch index {self.index!r} has {shards} primary shards; fencing tokens need exactly 1.",
                    hint="Recreate the lock index with one primary shard.",
                    id="django_esdlock.E004",
                )
            )
        return errors
