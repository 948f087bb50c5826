"""Real SQL stores for the tests: fresh PostgreSQL databases and SQLite files, and their lock configs.

The lock tables are made by the backend's ``setup()`` (django_esdlock's
migrations), which goes through Django's connection machinery: under
pytest-django, call these inside ``django_db_blocker.unblock()``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import tempfile
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator

import psycopg

from django_esdlock.bench.stores import made_tables
from django_esdlock.bench.stores import postgres_database as fresh_database
from django_esdlock.conf import load_backend

from .throwaway_postgres import test_database_url as database_url

DB_BACKEND = "django_esdlock.backends.database.DatabaseLockBackend"


def with_port(url: str, host: str, port: int) -> str:
    """``url`` pointing at another host and port, same user and database."""
    parts = urllib.parse.urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{auth + '@' if auth else ''}{host}:{port}"))


def db_config(url: str, *, ttl: float = 30.0) -> dict:
    """A lock backend config for the store at a database URL."""
    return {"BACKEND": DB_BACKEND, "OPTIONS": {"url": url}, "TTL": ttl}


def url_of(config: dict) -> str:
    return config["OPTIONS"]["url"]


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """Create an empty PostgreSQL database on the test server; yield its URL; drop it after."""
    with fresh_database(database_url(), prefix="esdlock_test") as url:
        yield url


@contextlib.contextmanager
def postgres_store(*, ttl: float = 30.0) -> Iterator[dict]:
    """Yield a lock config on a fresh PostgreSQL database with the lock tables made."""
    with postgres_database() as url:
        yield made_tables(db_config(url, ttl=ttl))


@contextlib.contextmanager
def sqlite_store(*, ttl: float = 30.0) -> Iterator[dict]:
    """Yield a lock config on a fresh SQLite file with the lock tables made."""
    directory = tempfile.mkdtemp(prefix="esdlock-sqlite-")
    try:
        # django-environ: four slashes for an absolute path.
        yield made_tables(db_config("sqlite:///" + os.path.join(directory, "locks.sqlite3"), ttl=ttl))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def clear_store(config: dict) -> None:
    """Remove every node, holder and waiting marker from a store, leaving tables and token source as they are."""
    url = url_of(config)
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(sqlite_path(config), timeout=30)) as connection, connection:
            connection.execute("DELETE FROM esdlock_holder")
            connection.execute("DELETE FROM esdlock_node")
            connection.execute("DELETE FROM esdlock_waiter")
    else:
        with psycopg.connect(url, autocommit=True) as connection:
            # A connection a test left in a transaction on these tables fails the reset, not the run.
            connection.execute("SET lock_timeout = '20s'")
            connection.execute("TRUNCATE esdlock_holder, esdlock_grant, esdlock_node, esdlock_waiter")


@contextlib.contextmanager
def shared_db_store(kind: str) -> Iterator[tuple[dict, Callable[[], bool]]]:
    """Yield a config on a store of ``kind`` ("postgres" or "sqlite") with its tables made, and a ``reset()``.

    ``reset()`` empties the lock tables for the next test (the token source
    keeps counting up) and returns False when it cannot: the caller then
    takes a fresh store instead.
    """
    with (postgres_store if kind == "postgres" else sqlite_store)() as config:

        def reset() -> bool:
            try:
                clear_store(config)
            except (psycopg.Error, sqlite3.Error):
                return False
            return True

        yield config, reset


def sqlite_path(config: dict) -> str:
    return url_of(config).removeprefix("sqlite:///")


# PostgreSQL keeps node rows between holds and records holders as grants
# named by the nodes' entries: a node is held while an entry's grant exists.
_PG_HOLDER_RECORDS = """
SELECT n.id FROM esdlock_node n CROSS JOIN LATERAL jsonb_object_keys(coalesce(n.entries, '{}'::jsonb)) AS e(holder_id)
JOIN esdlock_grant g ON g.holder_id = e.holder_id
"""


def table_counts(config: dict, *, markers: bool = False) -> tuple[int, ...]:
    """(held nodes, holder records), with ``markers`` also waiting markers, read without the backend."""
    if url_of(config).startswith("sqlite"):
        query = "SELECT (SELECT count(*) FROM esdlock_node), (SELECT count(*) FROM esdlock_holder)"
        if markers:
            query += ", (SELECT count(*) FROM esdlock_waiter)"
        with contextlib.closing(sqlite3.connect(sqlite_path(config), timeout=30)) as connection:
            return connection.execute(query).fetchone()
    query = f"WITH r AS ({_PG_HOLDER_RECORDS}) SELECT (SELECT count(DISTINCT id) FROM r), (SELECT count(*) FROM r)"
    if markers:
        query += ", (SELECT count(*) FROM esdlock_waiter)"
    with psycopg.connect(url_of(config), autocommit=True) as connection:
        return connection.execute(query).fetchone()


def holder_table(config: dict) -> str:
    """The table whose rows carry holders' leases: one per node and holder (SQLite) or per grant (PostgreSQL)."""
    return "esdlock_holder" if url_of(config).startswith("sqlite") else "esdlock_grant"


class TcpProxy:
    """A TCP relay to PostgreSQL that a test can cut and bring back, as if the database went away."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0
        """How many connections were relayed so far."""
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._server: socket.socket | None = None
        self.start()

    def start(self) -> None:
        """Listen (again, on the same port) and relay every connection."""
        server = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: the port comes back at once
        self.port = server.getsockname()[1]
        with self._lock:
            self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            with self._lock:
                if self._server is not server:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
                self.connections += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        with self._lock:
            server, self._server = self._server, None
            sockets, self._sockets = self._sockets, []
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            server.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def alias_config(alias: str, *, ttl: float = 30.0) -> dict:
    """A lock config on database ``alias`` of this process's settings, spelled as a URL for other processes.

    Test runners may rename an alias's database at run time; a peer process
    reading ``tests.settings`` afresh would then look elsewhere. The URL does not.
    """
    from django.db import connections

    settings_dict = connections.settings[alias]
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return db_config("sqlite:///" + os.path.abspath(settings_dict["NAME"]), ttl=ttl)
    user = urllib.parse.quote(settings_dict["USER"] or "")
    password = urllib.parse.quote(settings_dict["PASSWORD"] or "")
    auth = f"{user}:{password}@" if password else f"{user}@" if user else ""
    host = settings_dict["HOST"] or "127.0.0.1"
    port = f":{settings_dict['PORT']}" if settings_dict["PORT"] else ""
    return db_config(f"postgres://{auth}{host}{port}/{settings_dict['NAME']}", ttl=ttl)


# --- workers of the multi-process tests (spawned: they set Django up themselves) ---


def race_worker(config: dict, rounds: int, barrier, results) -> None:
    """Each round, race the other workers to take the same fresh tree; report who won which round."""
    from tests.peer import setup_django

    setup_django()
    from django_esdlock import LockUnavailable, lock_tree

    backend = load_backend(config)
    won = []
    try:
        for round_ in range(rounds):
            lock = lock_tree(f"/race/{round_}/dir/file", timeout=0, backend=backend)
            barrier.wait()
            try:
                lock.acquire()
            except LockUnavailable:
                token = None
            else:
                token = lock.token
            barrier.wait()  # every worker has tried before the winner lets go
            if token is not None:
                lock.release()
            won.append(token)
        results.put(("ok", won))
    except Exception as e:  # noqa: BLE001 - reported to the test process
        results.put(("error", f"{type(e).__name__}: {e} (cause: {e.__cause__!r})"))
    finally:
        backend.close()


def overlap_worker(config: dict, keys: list[str], rounds: int, start, results) -> None:
    """Take and give back ``keys`` (in the order given) many times; report errors, e.g. deadlocks."""
    from tests.peer import setup_django

    setup_django()
    from django_esdlock.exceptions import LockError
    from django_esdlock.modes import Mode
    from django_esdlock.records import Kind, LockRequest, Node, Owner

    backend = load_backend(config)
    errors: list[str] = []
    done = 0
    # IX is compatible with IX: every request is granted, so the transactions
    # of all workers overlap on the same rows, round after round.
    targets = tuple((Node("default", Kind.DOCUMENT, key), Mode.IX) for key in keys)
    start.wait()
    for _ in range(rounds):
        request = LockRequest(uuid.uuid4().hex, Owner.current(), targets, ttl=30)
        try:
            grant = backend.acquire(request)
            if grant is None:
                errors.append("refused a compatible request")
                continue
            backend.release(grant)
            done += 1
        except LockError as e:
            errors.append(f"{type(e).__name__}: {e} (cause: {e.__cause__!r})")
    backend.close()
    results.put((done, errors))


def blocked_acquirer(config: dict, path: str, ttl: float) -> None:
    """Acquire X on ``path`` (whose row the test keeps locked) and wait for the answer, until killed."""
    from tests.peer import setup_django

    setup_django()
    from django_esdlock import lock_tree

    backend = load_backend(config)
    lock_tree(path, ttl=ttl, timeout=0, backend=backend).acquire()
