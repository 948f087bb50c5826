"""Real stores for the tests: an Elasticsearch-compatible server and its configs."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from django_esdlock.noida import elasticsearch_url, free_port, local_elasticsearch

__all__ = ["ES_BACKEND", "elasticsearch_url", "es_config", "es_store", "free_port", "local_elasticsearch"]

ES_BACKEND = "django_esdlock.backends.elasticsearch.ElasticsearchLockBackend"


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
