"""Throwaway stores for a benchmark run: an Elasticsearch index, a PostgreSQL database, a local noida-db."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

from ..conf import DATABASE_BACKEND, ELASTICSEARCH_BACKEND, load_backend

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/test"

BENCH_TTL = 30.0
"""Lease of the benchmark's locks: long enough that no renewal runs during a measured pair."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    """Return once ``url`` answers HTTP; raise RuntimeError after ``timeout`` or if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"noida-db exited with {process.returncode} before serving {url}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"no Elasticsearch answered at {url} within {timeout:g}s") from None
            time.sleep(0.1)


@contextlib.contextmanager
def noida_elasticsearch() -> Iterator[str]:
    """Start noida-db's Elasticsearch on a free port in a temporary data dir; yield its URL; stop it after.

    noida-db is a test tool (the ``dev`` extra), not a runtime dependency:
    raise RuntimeError when it is not installed.
    """
    try:
        from importlib.resources import files

        binary = files("noida_db").joinpath("noida-db")
    except ModuleNotFoundError as e:
        raise RuntimeError("no Elasticsearch: pass --es-url, set ELASTICSEARCH_URL or install noida-db") from e
    os.chmod(str(binary), 0o755)
    port = _free_port()
    data_dir = tempfile.mkdtemp(prefix="esdlock-bench-noida-")
    log = open(os.path.join(data_dir, "server.log"), "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [str(binary), "start", "--only", "elasticsearch", "--elasticsearch-port", str(port), "--data-dir", data_dir],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def elasticsearch_url(url: str | None) -> Iterator[str]:
    """Yield ``url``, else ``ELASTICSEARCH_URL``, else the URL of a noida-db started for the run."""
    url = url or os.environ.get("ELASTICSEARCH_URL")
    if url:
        wait_until_up(url)
        yield url.rstrip("/")
    else:
        with noida_elasticsearch() as started:
            yield started


@contextlib.contextmanager
def elasticsearch_store(url: str) -> Iterator[dict[str, Any]]:
    """Yield a lock config on a fresh index of the cluster at ``url``; delete the index (and ``<index>-*``) after."""
    index = f"esdlock-bench-{uuid.uuid4().hex[:12]}"
    config = {"BACKEND": ELASTICSEARCH_BACKEND, "OPTIONS": {"hosts": [url], "index": index}, "TTL": BENCH_TTL}
    try:
        yield config
    finally:
        backend = load_backend(config)
        try:
            # One by one, no wildcard: clusters may refuse wildcard deletes (action.destructive_requires_name).
            for name in (index, f"{index}-naive"):
                backend.client.options(ignore_status=404).indices.delete(index=name)
        finally:
            backend.close()


def with_database(url: str, name: str) -> str:
    """Return ``url`` pointing at database ``name`` of the same server."""
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path="/" + name))


@contextlib.contextmanager
def postgres_store(url: str | None) -> Iterator[dict[str, Any]]:
    """Yield a lock config on a fresh database of the server at ``url`` (lock tables made); drop it after.

    ``url`` (else ``DATABASE_URL``, else the CI machine's PostgreSQL) is only
    used to create and drop the database, which needs the CREATEDB privilege.
    """
    import psycopg

    admin_url = url or os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    name = f"esdlock_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        config = {"BACKEND": DATABASE_BACKEND, "OPTIONS": {"url": with_database(admin_url, name)}, "TTL": BENCH_TTL}
        backend = load_backend(config)
        try:
            backend.setup()
        finally:
            backend.close()
        yield config
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
