"""Starts noida-db, the Elasticsearch-compatible server of the tests, the benchmark and the demo.

noida-db is a development and test tool (the ``dev`` extra), never a runtime
dependency: it is imported only when a server is started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .redaction import redact

PID_FILE = "noida-server.pid"


class NoidaUnavailable(RuntimeError):
    """noida-db is not installed or did not start."""


def port_is_free(port: int) -> bool:
    """Return True if a server could listen on ``port`` now (connections in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    """Return once ``url`` answers; raise NoidaUnavailable if ``process`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    # Any HTTP answer (a 401 of a cluster with security too) means up; user info is no part of a request URL.
    parts = urllib.parse.urlsplit(url)
    probe = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    while True:
        try:
            with urllib.request.urlopen(probe, timeout=1):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            if process is not None and process.poll() is not None:
                raise NoidaUnavailable(
                    redact(f"noida-db exited with {process.returncode} before serving {url}")
                ) from None
            if time.monotonic() > deadline:
                raise NoidaUnavailable(redact(f"nothing answered at {url} within {timeout:g}s")) from None
            time.sleep(0.1)


def _binary() -> str:
    try:
        from importlib.resources import files

        binary = files("noida_db").joinpath("noida-db")
    except ModuleNotFoundError as e:
        raise NoidaUnavailable(
            "noida-db is not installed (pip install -e '.[dev]'), and ELASTICSEARCH_URL is not set"
        ) from e
    os.chmod(str(binary), 0o755)
    return str(binary)


def _stop_leftover(data_dir: Path) -> None:
    """Stop a server an earlier demo started on this data dir and could not stop (it was killed)."""
    pid_file = data_dir / PID_FILE
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        pid_file.unlink(missing_ok=True)
        return
    # Only our own server: the noida-db binary, on this very data dir.
    if any(part.endswith(b"noida-db") for part in cmdline) and str(data_dir).encode() in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.1)
    pid_file.unlink(missing_ok=True)


@contextlib.contextmanager
def local_elasticsearch(data_dir: Path | None = None, *, port: int = 0) -> Iterator[str]:
    """Run noida-db's Elasticsearch on ``port`` (a free one if taken, or if 0); yield its URL; stop it after.

    Data persists in ``data_dir`` (a server left there by a killed earlier run
    is stopped first); without one, a temporary directory is used and removed.
    The server runs in its own session, so a Ctrl-C meant for a dev server
    does not kill it before we stop it.
    """
    binary = _binary()
    temporary = data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="esdlock-noida-")) if temporary else data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    _stop_leftover(data_dir)
    if port == 0 or not port_is_free(port):
        port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [binary, "start", "--only", "elasticsearch", "--elasticsearch-port", str(port), "--data-dir"]
    try:
        with open(data_dir / "server.log", "ab") as log:
            process = subprocess.Popen(
                [*command, str(data_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            (data_dir / PID_FILE).write_text(f"{process.pid}\n")
            try:
                wait_until_up(url, process)
                yield url
            finally:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                (data_dir / PID_FILE).unlink(missing_ok=True)
    finally:
        if temporary:
            shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def elasticsearch_url(url: str | None = None) -> Iterator[str]:
    """Yield ``url``, else ``ELASTICSEARCH_URL``, else the URL of a noida-db started for the duration."""
    url = url or os.environ.get("ELASTICSEARCH_URL")
    if url:
        wait_until_up(url)
        yield url.rstrip("/")
    else:
        with local_elasticsearch() as started:
            yield started
