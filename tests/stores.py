"""Real stores for the tests: an Elasticsearch-compatible server and its configs."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from django_esdlock.noida import elasticsearch_url, free_port, local_elasticsearch

__all__ = [
    "ES_BACKEND",
    "elasticsearch_url",
    "es_config",
    "es_store",
    "free_port",
    "local_elasticsearch",
    "node_source",
    "recorded_bulks",
    "tree_request",
]

ES_BACKEND = "django_esdlock.backends.elasticsearch.ElasticsearchLockBackend"


def tree_request(*targets: tuple[str, str], ttl: float = 30.0) -> Any:
    """A request of this thread for tree nodes of namespace ``fs``: ``tree_request(("/a", "IX"), ("/a/b", "X"))``."""
    from django_esdlock.modes import Mode
    from django_esdlock.records import Kind, LockRequest, Node, Owner

    nodes = tuple((Node("fs", Kind.TREE, path), Mode(mode)) for path, mode in targets)
    return LockRequest(uuid.uuid4().hex, Owner.current(), nodes, ttl)


def node_source(backend: Any, key: str) -> dict | None:
    """The document of tree node ``key`` of namespace ``fs`` in ``backend``'s lock index, as it is now (None: none)."""
    from django_esdlock.records import Kind, Node

    response = backend.client.options(ignore_status=404).get(index=backend.index, id=Node("fs", Kind.TREE, key).id)
    return response["_source"] if response.get("found") else None


def recorded_bulks(backend: Any) -> list[list[tuple[str, dict, dict | None]]]:
    """Record the ``_bulk`` bodies ``backend`` sends from now on: a list of lists of (verb, header, body)."""
    sent: list[list[tuple[str, dict, dict | None]]] = []
    perform = backend.perform

    def recording(call: Any) -> Any:
        if call.name == "bulk":
            lines = iter(call.kwargs["operations"])
            items = []
            for action in lines:
                ((verb, header),) = action.items()
                items.append((verb, header, None if verb == "delete" else next(lines)))
            sent.append(items)
        return perform(call)

    backend.perform = recording
    return sent


def es_config(url: str, *, ttl: float = 30.0) -> dict:
    """A lock backend config on a fresh, uniquely named index."""
    return {
        "BACKEND": ES_BACKEND,
        "OPTIONS": {"hosts": [url], "index": f"test-locks-{uuid.uuid4().hex[:12]}"},
        "TTL": ttl,
    }


@contextlib.contextmanager
def es_store(url: str, *, ttl: float = 30.0) -> Iterator[dict]:
    """Yield a lock backend config on a fresh index; delete the index after."""
    from django_esdlock.conf import load_backend

    config = es_config(url, ttl=ttl)
    try:
        yield config
    finally:
        backend = load_backend(config)
        backend.delete_indices()
        backend.close()


@contextlib.contextmanager
def es_backend(url: str) -> Iterator[Any]:
    """Yield a backend on a fresh lock index, set up; close it and delete the index after."""
    from django_esdlock.conf import load_backend

    with es_store(url) as config:
        backend = load_backend(config)
        backend.setup()
        try:
            yield backend
        finally:
            backend.close()


def _es_shape(config: dict) -> dict | None:
    """What a reset must find unchanged: the indices named like the lock index, their aliases, mappings and settings."""
    from elasticsearch import Elasticsearch, NotFoundError

    index = config["OPTIONS"]["index"]
    with contextlib.closing(Elasticsearch(config["OPTIONS"]["hosts"])) as client:
        try:
            found = client.indices.get(index=f"{index}*").body
        except NotFoundError:
            return None
    return {
        name: {
            "aliases": value.get("aliases"),
            "mappings": value.get("mappings"),
            # what setup() chose, without what differs between two creations of the same index
            "settings": {
                k: v
                for k, v in value.get("settings", {}).get("index", {}).items()
                if k not in ("uuid", "creation_date", "version", "provided_name")
            },
        }
        for name, value in found.items()
    }


@contextlib.contextmanager
def shared_es_store(url: str) -> Iterator[tuple[dict, Any]]:
    """Yield a config on a lock index set up now, and a ``reset()`` that empties it for the next test.

    ``reset()`` returns False when the index is no longer what setup made
    (deleted, recreated, remapped, resettled, or joined by another index of
    its name): the caller then takes a fresh store instead. Emptying keeps
    the index and its shard, so fencing tokens (the shard's sequence
    numbers) keep increasing from one test to the next, as a store's do.
    """
    from elasticsearch import Elasticsearch

    from django_esdlock.conf import load_backend

    with es_store(url) as config:
        backend = load_backend(config)
        try:
            backend.setup()
        finally:
            backend.close()
        shape = _es_shape(config)
        index = config["OPTIONS"]["index"]

        def reset() -> bool:
            if _es_shape(config) != shape:
                return False
            with contextlib.closing(Elasticsearch(config["OPTIONS"]["hosts"])) as client:
                client.indices.refresh(index=index)  # delete_by_query finds only what a search sees
                for _ in range(5):  # a document a leftover writer changed meanwhile is skipped: go again
                    client.delete_by_query(index=index, query={"match_all": {}}, conflicts="proceed", refresh=True)
                    if client.count(index=index)["count"] == 0:
                        return True
            return False

        yield config, reset
