"""Real stores for the tests: an Elasticsearch-compatible server and its configs."""

from __future__ import annotations

import uuid

from django_esdlock.noida import elasticsearch_url, free_port, local_elasticsearch

__all__ = ["ES_BACKEND", "elasticsearch_url", "es_config", "free_port", "local_elasticsearch"]

ES_BACKEND = "django_esdlock.backends.elasticsearch.ElasticsearchLockBackend"


def es_config(url: str, *, ttl: float = 30.0) -> dict:
    """A lock backend config on a fresh, uniquely named index."""
    return {
        "BACKEND": ES_BACKEND,
        "OPTIONS": {"hosts": [url], "index": f"test-locks-{uuid.uuid4().hex[:12]}"},
        "TTL": ttl,
    }
