"""Elasticsearch baselines: raw ``_create`` + ``DELETE`` pairs (of one document, and of one per node in a ``_bulk``),
the chapter's request-per-node sequence, and the same lock taking fresh nodes with a scripted upsert."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

from elasticsearch import helpers

from ..backends.elasticsearch.index import INDEX_SETTINGS
from ..conf import load_backend
from ..locks import lock_tree
from ..paths import ancestors
from .common import ratio_at_least, tree_path
from .kit import Baseline, RequestCount, StoreKit, bench_owner, fill_nodes

PAIR_GOALS = {1: 0.95, 4: 0.85, 16: 0.6}
"""Tree lock pairs/s against a raw ``_create`` + ``DELETE`` of one document, by depth: the store's limit."""

# The chapter's scripts, kept to its logic; Painless has no `assert false`, so a
# refusal is a no-op instead of an error (which the benchmark never meets:
# it runs one process at a time on these).
NAIVE_TAKE_SHARED = "if (ctx._source.lock_type == 'exclusive') { ctx.op = 'none' } else { ctx._source.lock_count++ }"
NAIVE_RELEASE_SHARED = "if (--ctx._source.lock_count == 0) { ctx.op = 'delete' }"

FILL_CHUNK = 2000
HOUR_MS = 3_600_000


class ElasticsearchKit(StoreKit):
    """The lock index of the run, a second index for the chapter's naive locks, and raw requests."""

    name = "elasticsearch"
    request_word = "requests"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.index: str = config["OPTIONS"]["index"]
        self.naive_index = f"{self.index}-naive"
        self._naive_ready = False

    @property
    def client(self) -> Any:
        return self.backend.client

    def baselines(self, depth: int) -> list[Baseline]:
        goal = PAIR_GOALS.get(depth)
        return [
            Baseline("raw", "raw _create + DELETE", self.raw_pair, ratio_at_least(goal) if goal else None),
            Baseline(
                "raw_bulk",
                f"raw _bulk of {depth} creates + _bulk of {depth} deletes",
                functools.partial(self.raw_bulk_pair, depth),
            ),
            Baseline(
                "naive",
                f"chapter's naive sequence ({2 * depth} requests)",
                functools.partial(self.naive_pair, tree_path(depth)),
                ratio_at_least(2.5) if depth == 4 else None,
            ),
            Baseline(
                "scripted",
                "same lock, fresh nodes by scripted upsert",
                functools.partial(self.scripted_pair, tree_path(depth)),
            ),
        ]

    def raw_pair(self) -> None:
        """Create and delete one document of the lock index: the least a lock pair can cost."""
        document = {"namespace": "bench-raw", "kind": "tree", "key": "/raw", "depth": 1}
        self.client.create(index=self.index, id="bench-raw", document=document)
        self.client.delete(index=self.index, id="bench-raw")

    def raw_bulk_pair(self, count: int) -> None:
        """Create ``count`` documents in one ``_bulk`` and delete them in another: the least a lock pair that
        writes one document per node of a depth-``count`` path can cost."""
        creates: list[dict[str, Any]] = []
        for i in range(count):
            creates.append({"create": {"_index": self.index, "_id": f"bench-raw-{i}"}})
            creates.append({"namespace": "bench-raw", "kind": "tree", "key": f"/raw{i}", "depth": 1})
        if self.client.bulk(operations=creates)["errors"]:
            raise RuntimeError("the raw bulk create failed")
        deletes = [{"delete": {"_index": self.index, "_id": f"bench-raw-{i}"}} for i in range(count)]
        if self.client.bulk(operations=deletes)["errors"]:
            raise RuntimeError("the raw bulk delete failed")

    @functools.cached_property
    def scripted_backend(self) -> Any:
        """The same lock index, fresh nodes taken with the scripted upsert instead of ``create`` (made at first use)."""
        return load_backend({**self.config, "OPTIONS": {**self.config["OPTIONS"], "grant_pipeline": None}})

    def scripted_pair(self, path: str) -> None:
        """The lock pair of the figure, its fresh nodes taken with the scripted upsert (no grant pipeline)."""
        with lock_tree(path, namespace="bench-scripted", backend=self.scripted_backend):
            pass

    def naive_pair(self, path: str) -> None:
        """Lock ``path`` as the chapter does, one request per node, then unlock it the same way."""
        if not self._naive_ready:
            mappings = {"properties": {"lock_type": {"type": "keyword"}, "lock_count": {"type": "integer"}}}
            self.client.indices.create(index=self.naive_index, settings=INDEX_SETTINGS, mappings=mappings)
            self._naive_ready = True
        parents = ancestors(path)
        for parent in parents:
            self.client.update(
                index=self.naive_index,
                id=parent,
                script={"source": NAIVE_TAKE_SHARED, "lang": "painless"},
                upsert={"lock_type": "shared", "lock_count": 1},
            )
        self.client.create(index=self.naive_index, id=path, document={"lock_type": "exclusive"})
        self.client.delete(index=self.naive_index, id=path)
        for parent in reversed(parents):
            self.client.update(
                index=self.naive_index, id=parent, script={"source": NAIVE_RELEASE_SHARED, "lang": "painless"}
            )

    @contextlib.contextmanager
    def counting(self) -> Iterator[RequestCount]:
        """Count HTTP requests at the transport's nodes: retries and every API the backend uses show up."""
        count = RequestCount()
        caller = threading.get_ident()
        nodes = self.client.transport.node_pool.all()
        for node in nodes:

            def counted(*args: Any, _send: Any = node.perform_request, **kwargs: Any) -> Any:
                if threading.get_ident() == caller:  # not the renewer thread
                    count.value += 1
                return _send(*args, **kwargs)

            node.perform_request = counted
        try:
            yield count
        finally:
            for node in nodes:
                del node.perform_request  # the class's method again

    def fill(self, namespace: str, count: int, *, expired: bool) -> None:
        self.backend.setup()
        now_ms = int(time.time() * 1000)
        expires_at = now_ms - HOUR_MS if expired else now_ms + 24 * HOUR_MS
        owner = bench_owner()

        def documents() -> Iterator[dict[str, Any]]:
            for i, node in enumerate(fill_nodes(namespace, count)):
                holder = {
                    "id": f"fill-{i}",
                    "mode": "X",
                    "owner": owner,
                    "acquired_at": expires_at - HOUR_MS,
                    "expires_at": expires_at,
                }
                source = {
                    "namespace": node.namespace,
                    "kind": node.kind.value,
                    "key": node.key,
                    "parent": None,
                    "depth": 1,
                    "lock_type": "exclusive",
                    "lock_count": 1,
                    "modes": ["X"],
                    "holders": [holder],
                }
                yield {"_index": self.index, "_id": node.id, "_source": source}

        helpers.bulk(self.client.options(request_timeout=120), documents(), chunk_size=FILL_CHUNK)
        self.client.indices.refresh(index=self.index)

    def delete_raw(self, namespace: str, count: int) -> None:
        actions = ({"_op_type": "delete", "_index": self.index, "_id": n.id} for n in fill_nodes(namespace, count))
        helpers.bulk(self.client.options(request_timeout=120), actions, chunk_size=self.backend.page_size)

    def facts(self) -> dict[str, Any]:
        info = self.client.info()
        self.backend.setup()  # verifies the grant pipeline
        pipeline = self.backend._pipeline or f"none ({self.backend._pipeline_why})"
        return {
            "server": f"Elasticsearch API {info['version']['number']}, node {info.get('name')!r}",
            "grant_pipeline": pipeline,
        }

    def close(self) -> None:
        if "scripted_backend" in self.__dict__:
            self.scripted_backend.close()
        super().close()
