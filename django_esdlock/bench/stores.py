"""Throwaway stores for a benchmark run: an Elasticsearch index, a PostgreSQL database, a SQLite file."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

from ..conf import DATABASE_BACKEND, ELASTICSEARCH_BACKEND, load_backend

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/test"

BENCH_TTL = 30.0
"""Lease of the benchmark's locks: long enough that no renewal runs during a measured pair."""


@contextlib.contextmanager
def elasticsearch_store(url: str) -> Iterator[dict[str, Any]]:
    """Yield a lock config on a fresh index of the cluster at ``url``; delete the index (and ``<index>-*``) after."""
    index = f"esdlock-bench-{uuid.uuid4().hex[:12]}"
    # Generous timeouts: a test server may take seconds per search of a 100k-node index.
    options = {"hosts": [url], "index": index, "request_timeout": 60}
    config = {"BACKEND": ELASTICSEARCH_BACKEND, "OPTIONS": options, "TTL": BENCH_TTL}
    try:
        yield config
    finally:
        backend = load_backend(config)
        try:
            # One by one, no wildcard: clusters may refuse wildcard deletes (action.destructive_requires_name).
            backend.delete_indices()
            backend.client.options(ignore_status=404).indices.delete(index=f"{index}-naive")
        finally:
            backend.close()


def with_database(url: str, name: str) -> str:
    """Return ``url`` pointing at database ``name`` of the same server."""
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path="/" + name))


@contextlib.contextmanager
def postgres_database(admin_url: str, *, prefix: str = "esdlock_bench") -> Iterator[str]:
    """Create an empty database on the server of ``admin_url``; yield its URL; drop it after.

    ``admin_url`` is only used to create and drop it, which needs the CREATEDB privilege.
    """
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def made_tables(config: dict[str, Any]) -> dict[str, Any]:
    """Create the lock tables of a database-backend config (its migrations); return the config."""
    backend = load_backend(config)
    try:
        backend.setup()
    finally:
        backend.close()
    return config


@contextlib.contextmanager
def postgres_store(url: str | None) -> Iterator[dict[str, Any]]:
    """Yield a lock config on a fresh database of the server at ``url`` (lock tables made); drop it after.

    ``url`` defaults to ``DATABASE_URL``, else the CI machine's PostgreSQL.
    """
    with postgres_database(url or os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL) as database:
        yield made_tables({"BACKEND": DATABASE_BACKEND, "OPTIONS": {"url": database}, "TTL": BENCH_TTL})


@contextlib.contextmanager
def sqlite_store() -> Iterator[dict[str, Any]]:
    """Yield a lock config on a fresh SQLite file in a temporary folder (lock tables made); remove it after."""
    directory = tempfile.mkdtemp(prefix="esdlock-bench-")
    try:
        url = f"sqlite:///{directory}/locks.sqlite3"  # four slashes: an absolute path
        yield made_tables({"BACKEND": DATABASE_BACKEND, "OPTIONS": {"url": url}, "TTL": BENCH_TTL})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
