"""The scale-out figure: lock pairs/s on an Elasticsearch cluster with one lock index, and with several."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings

from ..conf import ELASTICSEARCH_BACKEND, load_backend
from .stores import BENCH_TTL
from .workers import WorkerPool

PATHS = ["/a/b/c"]
"""One hot path per namespace: each process contends only with itself, so the store is the limit."""


def scale_out(
    hosts: Sequence[str],
    *,
    workers: int = 8,
    seconds: float = 3.0,
    index_counts: Sequence[int] = (1, 3),
    say: Callable[[str], None] = lambda message: None,
) -> list[dict[str, Any]]:
    """Return pairs/s of ``workers`` processes, each on a namespace of its own, for each count of lock indices.

    With N indices, namespace i is mapped to index i mod N (``namespace_indices``),
    so the namespaces spread evenly; with 1 it is the default single index.
    """
    settings_module = getattr(settings, "SETTINGS_MODULE", None) or os.environ["DJANGO_SETTINGS_MODULE"]
    pool = WorkerPool(workers, settings_module)
    figures = []
    try:
        for count in index_counts:
            base = f"esdlock-scale-{uuid.uuid4().hex[:10]}"
            namespaces = [f"scale-{i}" for i in range(workers)]
            options: dict[str, Any] = {"hosts": list(hosts), "index": base, "request_timeout": 30}
            if count > 1:
                options["namespace_indices"] = {ns: f"{base}-{i % count}" for i, ns in enumerate(namespaces)}
            config = {"BACKEND": ELASTICSEARCH_BACKEND, "OPTIONS": options, "TTL": BENCH_TTL}
            backend = load_backend(config)
            backend.setup()
            try:
                warm_until = time.monotonic() + 0.5  # connections open, scripts compiled
                pool.run_each(
                    "contend", config, [{"paths": PATHS, "namespace": ns, "stop_at": warm_until} for ns in namespaces]
                )
                say(f"scale-out: {workers} processes on {count} lock index(es), {seconds:g}s")
                stop_at = time.monotonic() + seconds
                kwargs = [{"paths": PATHS, "namespace": ns, "stop_at": stop_at} for ns in namespaces]
                results = pool.run_each("contend", config, kwargs)
                pairs = sum(r["pairs"] for r in results)
                elapsed = max(stop_at - min(r["began"] for r in results), 1e-9)
                primaries = _primaries(backend)
                figures.append(
                    {"indices": count, "workers": workers, "pairs_per_s": pairs / elapsed, "primaries_on": primaries}
                )
                pool.forget(config)
            finally:
                backend.delete_indices()
                backend.close()
    finally:
        pool.close()
    return figures


def _primaries(backend: Any) -> list[str]:
    """Return the node of each lock index's primary shard (where its writes go)."""
    rows = backend.client.cat.shards(index=",".join(backend.lock_indices), format="json")
    return sorted(row["node"] for row in rows if row["prirep"] == "p")
