"""Real stores for the tests: an Elasticsearch-compatible server and its configs."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from importlib.resources import files

ES_BACKEND = "django_esdlock.backends.elasticsearch.ElasticsearchLockBackend"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_up(url: str, process: subprocess.Popen | None, timeout: float = 30.0) -> None:
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
    """Start noida-db's Elasticsearch on a free port in a temporary data dir; yield its URL."""
    binary = files("noida_db").joinpath("noida-db")
    os.chmod(str(binary), 0o755)
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="esdlock-noida-")
    log = open(os.path.join(data_dir, "server.log"), "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [str(binary), "start", "--only", "elasticsearch", "--elasticsearch-port", str(port), "--data-dir", data_dir],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, process)
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
def elasticsearch_url() -> Iterator[str]:
    """Yield ``ELASTICSEARCH_URL`` when set, else the URL of a fresh noida-db."""
    url = os.environ.get("ELASTICSEARCH_URL")
    if url:
        _wait_until_up(url, None)
        yield url.rstrip("/")
    else:
        with noida_elasticsearch() as url:
            yield url


def es_config(url: str, *, ttl: float = 30.0) -> dict:
    """A lock backend config on a fresh, uniquely named index."""
    return {
        "BACKEND": ES_BACKEND,
        "OPTIONS": {"hosts": [url], "index": f"test-locks-{uuid.uuid4().hex[:12]}"},
        "TTL": ttl,
    }
