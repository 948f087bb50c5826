"""The database backend's own guarantees, on real PostgreSQL and SQLite (the contract runs in tests/contract/)."""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import sqlite3
import threading
import time
import uuid

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import path

from django_esdlock import LockBackendUnavailable, lock_documents, lock_tree
from django_esdlock.backends.database import DatabaseLockBackend
from django_esdlock.backends.database.postgresql import listener
from django_esdlock.backends.database.postgresql.functions import CURRENT, function_sql
from django_esdlock.conf import get_backend, load_backend
from django_esdlock.modes import Mode
from django_esdlock.records import Kind, LockRequest, Node, Owner

from .contract import all_holders
from .dbstores import (
    TcpProxy,
    alias_config,
    blocked_acquirer,
    clear_store,
    db_config,
    holder_table,
    overlap_worker,
    postgres_database,
    postgres_store,
    race_worker,
    sqlite_path,
    sqlite_store,
    table_counts,
    url_of,
    with_port,
)
from .expiry import expire
from .peer import SPAWN, Peer

# --- stores ---------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _db_access(django_db_blocker):
    """The lock backend opens connections of its own; pytest-django blocks them unless told."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture(scope="module")
def pg_store(django_db_blocker):
    with django_db_blocker.unblock(), postgres_store() as config:
        yield config


@pytest.fixture(scope="module")
def sqlite_store_config(django_db_blocker):
    with django_db_blocker.unblock(), sqlite_store() as config:
        yield config


@pytest.fixture(params=["postgres", "sqlite"])
def store(request):
    """Each vendor's store, emptied."""
    config = request.getfixturevalue("pg_store" if request.param == "postgres" else "sqlite_store_config")
    clear_store(config)
    return config


@pytest.fixture
def pg_config(pg_store):
    clear_store(pg_store)
    return pg_store


@pytest.fixture
def backend_of():
    """Build backends from configs and close them after the test."""
    built = []

    def build(config):
        built.append(load_backend(config))
        return built[-1]

    yield build
    for backend in built:
        backend.close()


def _request(*paths: str, mode: Mode = Mode.X, ttl: float = 30.0, intent=None, namespace: str = "default"):
    targets = tuple((Node(namespace, Kind.TREE, p), mode) for p in paths)
    return LockRequest(uuid.uuid4().hex, Owner.current(), targets, ttl=ttl, intent=intent)


def _tree(depth: int) -> str:
    return "/" + "/".join(f"d{i}" for i in range(depth))


def _sql(config: dict, statement: str, params=()) -> None:
    """Run one statement on the store, outside the backend (an operator's or a clock's doing)."""
    if url_of(config).startswith("sqlite"):
        with sqlite3.connect(sqlite_path(config), timeout=30) as connection:
            connection.execute(statement.replace("%s", "?"), params)
        connection.close()
    else:
        with psycopg.connect(url_of(config), autocommit=True) as connection:
            connection.execute(statement, params)


# --- configuration --------------------------------------------------------------


def test_construction_opens_no_connection(pg_config, tmp_path):
    url = url_of(pg_config)
    proxy = TcpProxy("127.0.0.1", int(psycopg.conninfo.conninfo_to_dict(url).get("port") or 5432))
    try:
        backend = load_backend(db_config(with_port(url, "127.0.0.1", proxy.port)))
        assert backend.describe()
        assert proxy.connections == 0  # nothing on the wire until the first use
        assert backend.check() == []  # check --deploy's: it connects
        backend.holders()
        assert proxy.connections == 1
        backend.close()
    finally:
        proxy.stop()
    path = tmp_path / "locks.sqlite3"
    for options in ({"url": f"sqlite:///{path}?ttl=3"}, {"using": "postgres"}, {"using": "default"}):
        backend = DatabaseLockBackend(**options)
        assert backend.describe() and len(backend._wrappers) == 0
    assert not path.exists()
    assert DatabaseLockBackend(url="postgres://u:secret@h/d").describe() == "PostgreSQL database 'd' on h"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"url": "postgres://h/d", "index": "x"}, "unknown OPTIONS index"),
        ({}, "exactly one"),
        ({"url": "postgres://h/d", "using": "default"}, "exactly one"),
        ({"using": "nowhere"}, "names no database"),
        ({"url": "oracle://u@h/d"}, "cannot load database engine|supports PostgreSQL and SQLite"),
        ({"url": "sqlite://:memory:"}, "in-memory"),
    ],
)
def test_bad_options_are_improperly_configured(options, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        DatabaseLockBackend(**options)


def test_lock_backend_setting_accepts_database_urls(pg_config, sqlite_store_config):
    for config in (pg_config, sqlite_store_config):
        clear_store(config)
        with override_settings(LOCK_BACKEND=url_of(config) + "?ttl=7"):
            backend = get_backend()
            assert isinstance(backend, DatabaseLockBackend) and backend.ttl == 7.0
            assert backend.url.startswith(url_of(config))
            with lock_tree("/from/url", timeout=0) as lock:
                assert lock.token > 0
                assert table_counts(config) == (2, 2)
        assert table_counts(config) == (0, 0)


def test_migrations_are_complete():
    call_command("makemigrations", "django_esdlock", "--check", "--dry-run", stdout=io.StringIO())


def test_tables_are_made_on_first_use(backend_of, tmp_path):
    with postgres_database() as url:
        for config in (db_config(url), db_config(f"sqlite:///{tmp_path}/fresh.sqlite3")):
            backend = backend_of(config)
            with lock_tree("/first/use", backend=backend) as lock:
                assert lock.token == 1
            backend.close()


def test_check_contacts_the_lock_database_and_reports_it_unreachable(backend_of):
    """backend.check() connects (only ``check --deploy`` runs it: see test_deploys.py)."""
    backend = backend_of(db_config("postgres://postgres@127.0.0.1:9/none"))
    assert len(backend._wrappers) == 0  # built without a connection
    [error] = backend.check()
    assert error.id == "django_esdlock.E002"
    aliased = backend_of({"BACKEND": db_config("")["BACKEND"], "OPTIONS": {"using": "postgres"}})
    assert aliased.check() == [] and len(aliased._wrappers) == 1


# --- transactions -----------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 4, 16])
def test_round_trips_do_not_grow_with_depth(store, backend_of, depth):
    backend = backend_of(store)
    backend.holders()  # a connection is set up once; that is not the acquire's cost
    counts = {}
    for size in (1, depth):
        lock = lock_tree(_tree(size), backend=backend)
        with CaptureQueriesContext(backend.connection) as acquired:
            lock.acquire()
        with CaptureQueriesContext(backend.connection) as renewed:
            assert backend.renew(lock.grant)
        with CaptureQueriesContext(backend.connection) as released:
            lock.release()
        counts[size] = (len(acquired), len(renewed), len(released))
    assert counts[depth] == counts[1]
    statements = [q["sql"] for q in acquired.captured_queries]
    if backend.vendor == "sqlite":
        assert statements[0] == "BEGIN IMMEDIATE" and statements.count("BEGIN IMMEDIATE") == 1  # one transaction
    else:  # one autocommit call each: a server-side function, or (renew) one UPDATE of the grant row
        assert counts[depth] == (1, 1, 1)
        assert "esdlock_acquire(" in statements[0] and "BEGIN" not in statements[0]
        assert "esdlock_release(" in released.captured_queries[0]["sql"]


@pytest.mark.parametrize("alias", ["postgres", "default"])
def test_acquire_inside_atomic_commits_on_its_own(alias, backend_of):
    from django_esdlock.models import LockNode

    config = alias_config(alias)
    backend = backend_of({"BACKEND": config["BACKEND"], "OPTIONS": {"using": alias}})
    backend.setup()
    clear_store(config)
    peer = Peer(config)
    try:
        # On SQLite a transaction that has written holds the file's only write
        # lock until it ends, and every lock write (here or in the peer) waits
        # for it: there the caller writes after the locking (a documented limit).
        postgres = backend.vendor == "postgresql"
        with pytest.raises(RuntimeError, match="roll back"), transaction.atomic(using=alias):
            if postgres:
                LockNode.objects.using(alias).create(id="caller:before", namespace="caller", kind="doc", key="b")
            lock = lock_tree("/in/atomic", backend=backend).acquire()
            assert connections[alias].in_atomic_block
            assert peer.acquire("x", scheme="tree", path="/in/atomic", timeout=0) == "LockUnavailable"
            LockNode.objects.using(alias).create(id="caller:after", namespace="caller", kind="doc", key="a")
            raise RuntimeError("roll back the caller's work")
        assert not LockNode.objects.using(alias).filter(namespace="caller").exists()  # rolled back
        assert peer.acquire("x", scheme="tree", path="/in/atomic", timeout=0) == "LockUnavailable"  # still held
        lock.release()
        assert isinstance(peer.acquire("x", scheme="tree", path="/in/atomic", timeout=0), dict)
    finally:
        peer.close()
        clear_store(config)


_view_state: dict = {}


def _lock_in_request(request):
    state = _view_state
    state["lock"] = lock_tree("/in/request", backend=state["backend"]).acquire()
    state["atomic"] = connections[state["alias"]].in_atomic_block
    state["peer_saw"] = state["peer"].acquire("x", scheme="tree", path="/in/request", timeout=0)
    from django_esdlock.models import LockNode

    LockNode.objects.using(state["alias"]).create(id="request:row", namespace="request", kind="doc", key="r")
    raise RuntimeError("the view fails: roll back the request")


urlpatterns = [path("lock-in-request/", _lock_in_request)]


@pytest.mark.parametrize("alias", ["postgres", "default"])
def test_acquire_under_atomic_requests_commits_on_its_own(alias, backend_of, monkeypatch):
    from django_esdlock.models import LockNode

    config = alias_config(alias)
    backend = backend_of({"BACKEND": config["BACKEND"], "OPTIONS": {"using": alias}})
    backend.setup()
    clear_store(config)
    monkeypatch.setitem(connections.settings[alias], "ATOMIC_REQUESTS", True)
    peer = Peer(config)
    _view_state.update(backend=backend, alias=alias, peer=peer)
    try:
        with override_settings(ROOT_URLCONF=__name__), pytest.raises(RuntimeError, match="roll back the request"):
            Client().get("/lock-in-request/")
        assert _view_state["atomic"] is True
        assert _view_state["peer_saw"] == "LockUnavailable"
        assert not LockNode.objects.using(alias).filter(namespace="request").exists()
        assert peer.acquire("x", scheme="tree", path="/in/request", timeout=0) == "LockUnavailable"
        _view_state["lock"].release()
        assert isinstance(peer.acquire("x", scheme="tree", path="/in/request", timeout=0), dict)
    finally:
        _view_state.clear()
        peer.close()
        clear_store(config)


# --- semantics the contract leaves to the store ---------------------------------------------


def test_expiry_is_judged_by_the_database_clock(store, backend_of):
    backend = backend_of(store)
    grant = backend.acquire(_request("/clock", ttl=3600))
    # The client thinks the lease has an hour to run; the database says it ended.
    _sql(store, f"UPDATE {holder_table(store)} SET expires_at = %s", ["2000-01-01 00:00:00.000"])
    assert backend.renew(grant) is False
    other = backend.acquire(_request("/clock", ttl=1))
    assert other is not None and other.token > grant.token
    # And the other way round: a lease the database extends blocks, whatever its TTL and however long ago it began.
    _sql(
        store,
        f"UPDATE {holder_table(store)} SET acquired_at = %s, expires_at = %s",
        ["2000-01-01 00:00:00.000", "2999-01-01 00:00:00.000"],
    )
    assert backend.acquire(_request("/clock")) is None
    [holder] = backend.node_holders(Node("default", Kind.TREE, "/clock"))
    assert holder.expires_at.year == 2999


def test_expired_holder_with_intent_keeps_conflicting_until_recovered(store, backend_of):
    backend = backend_of(store)
    intent = {"op": "rename", "to": "/bill"}
    crashed = backend.acquire(_request("/clinton", intent=intent))
    plain = backend.acquire(_request("/other"))
    expire(backend)
    assert backend.acquire(_request("/clinton")) is None
    assert {h.holder_id for h in backend.evict_expired()} == {plain.request.holder_id}
    [kept] = backend.node_holders(Node("default", Kind.TREE, "/clinton"))
    assert kept.intent == intent and kept.expired and kept.holder_id == crashed.request.holder_id
    assert backend.release(crashed) is True
    assert table_counts(store) == (0, 0)


def test_retried_request_replaces_its_holder(store, backend_of):
    backend = backend_of(store)
    request = _request("/a", "/a/b", mode=Mode.S)
    first = backend.acquire(request)
    second = backend.acquire(request)  # the response was lost; the client sends it again
    assert second.token > first.token
    holders = all_holders(backend)
    assert sorted(h.node.key for h in holders) == ["/a", "/a/b"]
    assert {h.token for h in holders} == {second.token}
    assert backend.release(second) is True and all_holders(backend) == []


def test_only_the_owner_releases_or_renews_and_a_takeover_changes_the_owner(store, backend_of):
    backend = backend_of(store)
    grant = backend.acquire(_request("/job", "/job/step", ttl=30, intent={"op": "x"}))
    someone_else = dataclasses.replace(grant.request.owner, process="other")
    impostor = dataclasses.replace(grant, request=dataclasses.replace(grant.request, owner=someone_else))
    assert backend.renew(impostor) is False and backend.release(impostor) is False
    records = backend.holder_records(grant.request.holder_id)
    assert sorted(r.node.key for r in records) == ["/job", "/job/step"]
    reaper = dataclasses.replace(Owner.current(), process="reaper")
    assert backend.take_over(records, reaper, ttl=30, recovery={"state": "running"}) is None  # not expired
    taken = backend.take_over(records, reaper, ttl=30, recovery={"state": "running"}, require_expired=False)
    assert taken.token > grant.token and sorted(n.key for n in taken.taken) == ["/job", "/job/step"]
    again = backend.take_over(records, reaper, ttl=30, recovery={"state": "running"}, require_expired=False)
    assert again is None  # the records name the old owner: another reaper won
    assert backend.renew(grant) is False and backend.release(grant) is False  # no longer the old owner's
    assert backend.renew(taken, recovery={"state": "failed", "attempts": 1}) is True
    assert {r.recovery["state"] for r in backend.holder_records(grant.request.holder_id)} == {"failed"}
    assert {r.owner["key"] for r in backend.holder_records(grant.request.holder_id)} == {reaper.key}
    assert backend.force_release(grant.request.holder_id, taken.taken) is True
    assert table_counts(store) == (0, 0)


def _node_rows(config: dict) -> int:
    with psycopg.connect(url_of(config), autocommit=True) as connection:
        return connection.execute("SELECT count(*) FROM esdlock_node").fetchone()[0]


def test_postgres_node_rows_stay_between_holds_until_the_reaper_finds_them_idle(pg_config, backend_of):
    backend = backend_of(pg_config)
    with lock_tree("/keep/me", backend=backend):
        pass
    assert table_counts(pg_config) == (0, 0) and _node_rows(pg_config) == 2  # released: rows stay, unheld
    with lock_tree("/keep/me", backend=backend) as lock, lock_tree("/keep/other", backend=backend):
        assert _node_rows(pg_config) == 3  # reused, not made again
        backend.evict_expired()
        assert _node_rows(pg_config) == 3  # held: not idle
        assert [h.holder_id for h in backend.node_holders(Node("default", Kind.TREE, "/keep/me"))] == [lock.holder_id]
    assert backend.evict_expired() == [] and _node_rows(pg_config) == 0


def test_reentered_document_locks_write_nothing(store, backend_of):
    backend = backend_of(store)
    with lock_documents(["1", "2"], backend=backend) as outer:
        with lock_documents(["1", "2"], timeout=0, backend=backend) as inner:
            assert inner.grant.taken == () and inner.token > outer.token
        assert {h.holder_id for h in all_holders(backend)} == {outer.holder_id}


def test_holders_pages_and_filters(store, backend_of):
    backend = backend_of(store)
    for i in range(7):
        backend.acquire(_request(f"/p/{i}", mode=Mode.S))
        backend.acquire(_request(f"/p/{i}", mode=Mode.S, namespace="other"))
    seen, cursor, pages = [], None, 0
    while True:
        page = backend.holders(cursor=cursor, limit=4)
        seen += [(h.node, h.holder_id) for h in page.holders]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(seen) == len(set(seen)) == 7 * 2 and pages == 4
    in_other = backend.holders(namespace="other", limit=100).holders
    assert len(in_other) == 7 and {h.node.namespace for h in in_other} == {"other"}
    below = backend.holders(namespace="default", path_prefix="/p/", limit=100).holders
    assert sorted(h.node.key for h in below) == [f"/p/{i}" for i in range(7)]
    with pytest.raises(ValueError, match="cursor"):
        backend.holders(cursor="not-a-cursor")


def test_evict_expired_pages_through_the_table(store, backend_of):
    backend = backend_of(store)
    backend.page_size = 3
    expiring = [backend.acquire(_request(f"/e/{i}", namespace="ns")) for i in range(8)]
    expiring.append(backend.acquire(_request("/e/x", namespace="kept")))
    expiring.append(backend.acquire(_request("/e/intent", namespace="ns", intent={"op": "x"})))
    live = backend.acquire(_request("/e/live", namespace="ns"))
    expire(backend, *(grant.request.holder_id for grant in expiring), by=40)  # ended 10 s ago: inside 60 s of grace
    assert backend.evict_expired(namespace="ns", grace=60) == []
    would = backend.evict_expired(namespace="ns", dry_run=True)
    assert sorted(h.node.key for h in would) == [f"/e/{i}" for i in range(8)]
    assert len(all_holders(backend)) == 8 + 3
    counts = []
    evicted = backend.evict_expired(namespace="ns", progress=counts.append)
    # One page at a time (of nodes, or on PostgreSQL of grants of every namespace): at most 3 more each.
    steps = [b - a for a, b in zip([0, *counts[:-1]], counts, strict=True)]
    assert counts[-1] == 8 and len(counts) >= 3 and all(0 <= step <= 3 for step in steps)
    assert sorted((h.node.key, h.holder_id) for h in evicted) == sorted((h.node.key, h.holder_id) for h in would)
    left = {(h.node.namespace, h.node.key) for h in all_holders(backend)}
    assert left == {("kept", "/e/x"), ("ns", "/e/intent"), ("ns", "/e/live")}
    assert backend.release(live) is True


# --- many processes -----------------------------------------------------------------------


def test_racing_creators_of_missing_rows_never_both_win(store):
    rounds, workers = 150, 3
    barrier, results = SPAWN.Barrier(workers), SPAWN.Queue()
    processes = [SPAWN.Process(target=race_worker, args=(store, rounds, barrier, results)) for _ in range(workers)]
    for process in processes:
        process.start()
    reports = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    assert [status for status, _ in reports] == ["ok"] * workers, reports
    for round_ in range(rounds):
        winners = [won[round_] for _, won in reports if won[round_] is not None]
        assert len(winners) == 1, f"round {round_}: {winners}"
    assert table_counts(store) == (0, 0)


def test_opposite_orders_never_deadlock(store):
    keys = [f"k{i:02d}" for i in range(18)]
    orders = [keys[:12], list(reversed(keys[6:])), keys[::2] + list(reversed(keys[1::2]))]
    rounds = 250
    start, results = SPAWN.Event(), SPAWN.Queue()
    processes = [SPAWN.Process(target=overlap_worker, args=(store, order, rounds, start, results)) for order in orders]
    for process in processes:
        process.start()
    start.set()
    reports = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    assert [errors for _, errors in reports] == [[]] * len(orders)
    assert [done for done, _ in reports] == [rounds] * len(orders)
    assert table_counts(store) == (0, 0)


# --- failures -----------------------------------------------------------------------------------


def _hold_row_lock(url: str, node_id: str) -> psycopg.Connection:
    """Open a transaction that has inserted (so locks) the node row ``node_id``, and keep it open."""
    blocker = psycopg.connect(url)
    blocker.execute(
        "INSERT INTO esdlock_node (id, namespace, kind, key, parent, depth) VALUES (%s, 'default', 'tree', '', '', 0)",
        [node_id],
    )
    return blocker


def _waiting_backend_pid(url: str, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row:
                return row[0]
            time.sleep(0.02)
    raise AssertionError("no acquire came to wait on the row lock")


def _acquire_in_thread(backend, request) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run():
        try:
            outcome["grant"] = backend.acquire(request)
        except Exception as e:  # noqa: BLE001 - inspected by the test
            outcome["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_session_killed_mid_acquire_leaves_nothing_held(pg_config, backend_of):
    url = url_of(pg_config)
    backend = backend_of(pg_config)
    blocker = _hold_row_lock(url, "tree:default:/killed/a/b")
    try:
        thread, outcome = _acquire_in_thread(backend, _request("/killed", "/killed/a", "/killed/a/b"))
        pid = _waiting_backend_pid(url)
        with psycopg.connect(url, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        thread.join(timeout=10)
        assert isinstance(outcome.get("error"), LockBackendUnavailable), outcome
    finally:
        blocker.rollback()
        blocker.close()
    assert table_counts(pg_config) == (0, 0)  # /killed and /killed/a were created, then rolled back
    grant = backend.acquire(_request("/killed", "/killed/a", "/killed/a/b"))  # a new connection
    assert grant is not None and backend.release(grant)


def _lease_bound(records, keys: set[str], ttl: float) -> bool:
    """Whether ``records`` are nothing, or one holder on exactly ``keys`` whose lease is at most ``ttl``."""
    if not records:
        return True
    return (
        {r.node.key for r in records} == keys
        and len({r.holder_id for r in records}) == 1
        and all((r.expires_at - r.acquired_at).total_seconds() <= ttl for r in records)
    )


def _wait_for_session_to_end(url: str, pid: int, timeout: float = 30.0) -> None:
    """Poll until the server has ended session ``pid`` (rolled back or committed, and gone)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as watcher:
        while watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]:
            assert time.monotonic() < deadline, f"session {pid} still open after {timeout:g}s"
            time.sleep(0.02)


def test_database_gone_mid_acquire_then_back(pg_config, backend_of):
    url = url_of(pg_config)
    proxy = TcpProxy("127.0.0.1", int(psycopg.conninfo.conninfo_to_dict(url).get("port") or 5432))
    backend = backend_of(db_config(with_port(url, "127.0.0.1", proxy.port)))
    try:
        assert backend.acquire(_request("/warm")) is not None  # connected through the proxy
        blocker = _hold_row_lock(url, "tree:default:/cut/a/b")
        try:
            thread, outcome = _acquire_in_thread(backend, _request("/cut", "/cut/a", "/cut/a/b", ttl=1))
            orphan = _waiting_backend_pid(url)
            proxy.stop()
            thread.join(timeout=10)
            assert isinstance(outcome.get("error"), LockBackendUnavailable), outcome
            with pytest.raises(LockBackendUnavailable):
                backend.acquire(_request("/while/down"))
        finally:
            blocker.rollback()
            blocker.close()
        # The orphaned session either notices its client gone and rolls back, or commits a grant
        # nobody will use: its lease (1 s) ends it, and the next acquisition evicts it.
        _wait_for_session_to_end(url, orphan)
        records = [h for h in backend_of(pg_config).holders().holders if h.node.key != "/warm"]
        assert _lease_bound(records, {"/cut", "/cut/a", "/cut/a/b"}, 1.0), records
        if records:
            expire(backend_of(pg_config), records[0].holder_id)  # its lease runs out
        proxy.start()
        with lock_tree("/cut/a/b", timeout=30, backend=backend) as lock:
            assert all(lock.token > r.token for r in records)
    finally:
        proxy.stop()


def test_a_lost_acquire_answer_gives_the_grant_back(pg_config, backend_of, monkeypatch):
    """The call committed a grant, the answer never reached the caller: the holder id is released at once."""
    backend = backend_of(pg_config)
    call = backend.dialect.acquire

    def answer_lost(cursor, **kwargs):
        call(cursor, **kwargs)
        raise KeyboardInterrupt  # e.g. interrupted while reading the answer

    monkeypatch.setattr(backend.dialect, "acquire", answer_lost)
    with pytest.raises(KeyboardInterrupt):
        backend.acquire(_request("/lost/answer", "/lost/answer/here"))
    assert table_counts(pg_config) == (0, 0)
    monkeypatch.undo()
    assert backend.acquire(_request("/lost/answer/here")) is not None


def test_client_killed_before_the_answer_leaves_at_most_a_lease_bound_grant(pg_config, backend_of):
    """Acquire is one autocommit call: a client killed after sending it may leave a grant; its lease ends it."""
    url = url_of(pg_config)
    backend = backend_of(pg_config)
    outcomes = []
    for round_ in range(6):
        path = f"/killed/{round_}"
        blocker = _hold_row_lock(url, f"tree:default:{path}")
        try:
            child = SPAWN.Process(target=blocked_acquirer, args=(pg_config, path, 1.0), daemon=True)
            child.start()
            session = _waiting_backend_pid(url, timeout=60)  # the call is sent, its answer not read
            child.kill()
            child.join(timeout=10)
            # At once (before the server's 1 s client check) on even rounds: the call then
            # finishes and commits; on odd ones once the server noticed the dead client and ended its session.
            if round_ % 2:
                _wait_for_session_to_end(url, session)
        finally:
            blocker.rollback()
            blocker.close()
        _wait_for_session_to_end(url, session)
        records = backend.node_holders(Node("default", Kind.TREE, path))
        assert _lease_bound(records, {path}, 1.0), records
        outcomes.append(bool(records))
        if records:
            expire(backend, records[0].holder_id)  # its lease runs out
        with lock_tree(path, timeout=0, backend=backend) as lock:  # evicts the expired grant
            assert all(lock.token > r.token for r in records)
            assert [h.holder_id for h in backend.node_holders(Node("default", Kind.TREE, path))] == [lock.holder_id]
    assert any(outcomes)  # the case that matters happened: a grant committed for a dead client
    assert table_counts(pg_config) == (0, 0)


def test_unreachable_store_raises_backend_unavailable(backend_of, tmp_path):
    for config in (
        db_config("postgres://postgres@127.0.0.1:9/none"),
        db_config(f"sqlite:///{tmp_path}/missing-dir/locks.sqlite3"),
    ):
        backend = backend_of(config)
        with pytest.raises(LockBackendUnavailable):
            backend.acquire(_request("/x"))
        with pytest.raises(LockBackendUnavailable):
            lock_tree("/x", timeout=0, backend=backend).acquire()


# --- connections and waiting ------------------------------------------------------------------


def test_each_thread_has_its_own_connection_closed_with_the_thread(store, backend_of):
    backend = backend_of(store)
    backend.holders()
    mine = backend.connection
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append((backend.connection, backend.holders())))
    thread.start()
    thread.join()
    their_connection = theirs[0][0]
    assert their_connection is not mine and their_connection.connection is None  # closed as its thread ended
    assert mine.connection is not None
    backend.close()
    assert mine.connection is None
    assert backend.holders().holders == []  # reopens
    assert backend.connection is not mine


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_forked_child_opens_its_own_connection(pg_config, backend_of):
    backend = backend_of(pg_config)
    grant = backend.acquire(_request("/parent"))
    parent_pid = backend.connection.connection.info.backend_pid
    pid = os.fork()
    if pid == 0:  # the child: must not touch the parent's session
        try:
            child = backend.acquire(_request("/child"))
            ok = child is not None and backend.connection.connection.info.backend_pid != parent_pid
            os._exit(0 if ok and backend.release(child) else 1)
        except BaseException:  # noqa: BLE001 - anything: fail the child
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.connection.connection.info.backend_pid == parent_pid
    assert backend.release(grant) is True


def test_the_lock_session_fails_calls_to_a_dead_peer_in_time(pg_config, backend_of):
    backend = backend_of({**pg_config, "TTL": 30})
    grant = backend.acquire(_request("/bounded"))
    parameters = backend.connection.connection.info.get_parameters()
    assert {name: parameters.get(name) for name in ("tcp_user_timeout", "keepalives", "keepalives_idle")} == {
        "tcp_user_timeout": "10000",
        "keepalives": "1",
        "keepalives_idle": "10",
    }

    def statement_timeout() -> str:
        with backend.connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            return cursor.fetchone()[0]

    configured = statement_timeout()
    assert backend.renew_many([grant], timeout=2.5) == [True]
    assert statement_timeout() == "2500ms"  # the renewal's bound, a third of what was left of its lease
    assert backend.renew(grant, timeout=3.0) is True
    assert statement_timeout() == "2500ms"  # close enough to the last: not set again
    assert backend.release(grant) is True
    assert statement_timeout() == configured  # an unbounded call gets the session's own setting back


def test_a_renewal_bounded_below_what_the_database_takes_fails(pg_config, backend_of):
    backend = backend_of(pg_config)
    grant = backend.acquire(_request("/slow"))
    with psycopg.connect(url_of(pg_config), autocommit=True) as blocker, blocker.transaction():
        blocker.execute("SELECT 1 FROM esdlock_grant WHERE holder_id = %s FOR UPDATE", [grant.request.holder_id])
        with pytest.raises(LockBackendUnavailable, match="statement timeout"):
            backend.renew_many([grant], timeout=0.2)  # the grant row is locked: the call would wait 10 s
    assert backend.renew_many([grant], timeout=0.2) == [True]
    assert backend.release(grant) is True


def _queued(*paths: str, mode: Mode = Mode.X) -> LockRequest:
    return dataclasses.replace(_request(*paths, mode=mode), ticket=time.time_ns())


def test_release_wakes_the_waiting_session_through_notify(pg_config, backend_of):
    backend = backend_of(pg_config)
    assert backend.supports_notify
    peer = Peer(pg_config)
    releaser = threading.Timer(0.2, peer.release, args=("held",))
    try:
        peer.acquire("held", scheme="tree", path="/wake/me")
        peer.acquire("elsewhere", scheme="tree", path="/unrelated")
        request = _queued("/wake/me")
        assert backend.acquire(request) is None  # leaves a marker naming this session's channel
        backend.wait_release(request, 1, attempt=0)  # a session's first wait starts listening and returns
        assert listener.listening(backend.connection)
        assert backend.acquire(request) is None
        peer.release("elsewhere")
        assert listener.wait(backend.connection, 0.5) is False  # nobody waits there: no notification at all
        releaser.start()
        assert listener.wait(backend.connection, 30) is True
        assert backend.acquire(request) is not None
    finally:
        if releaser.ident is not None:  # its answer read off the peer's pipe before the next call: one reader at once
            releaser.join(30)
        peer.close()


def test_release_wakes_only_waiters_it_may_free(pg_config, backend_of):
    """Giving back intention locks on a shared ancestor wakes nobody waiting for a leaf; the leaf's release does."""
    backend = backend_of(pg_config)
    peer = Peer(pg_config)
    releaser = threading.Timer(0.2, peer.release, args=("held",))
    try:
        peer.acquire("held", scheme="tree", path="/t/leaf")
        peer.acquire("sibling", scheme="tree", path="/t/sibling")
        targets = lock_tree("/t/leaf", backend=backend).targets  # IX on /t, X on /t/leaf
        request = LockRequest(uuid.uuid4().hex, Owner.current(), targets, ttl=30, ticket=time.time_ns())
        assert backend.acquire(request) is None
        backend.wait_release(request, 1, attempt=0)  # starts listening
        assert backend.acquire(request) is None
        peer.release("sibling")  # IX on /t and X on /t/sibling: frees nothing this request waits for
        assert listener.wait(backend.connection, 0.5) is False
        assert backend.acquire(request) is None
        releaser.start()
        assert listener.wait(backend.connection, 30) is True
        assert backend.acquire(request) is not None
    finally:
        if releaser.ident is not None:  # its answer read off the peer's pipe before the next call: one reader at once
            releaser.join(30)
        peer.close()


def test_release_wakes_the_head_of_the_queue_only(pg_config, backend_of):
    """Of two writers queued on one node the release wakes the earlier; its release wakes the next."""
    first, second = backend_of(pg_config), backend_of(pg_config)  # one session each
    holder = backend_of(pg_config).acquire(_request("/q"))
    early, late = _queued("/q"), _queued("/q")
    for backend, request in ((first, early), (second, late)):
        assert backend.acquire(request) is None
        backend.wait_release(request, 1, attempt=0)  # starts listening
        assert backend.acquire(request) is None
    assert first.release(holder)
    assert listener.wait(first.connection, 30) is True
    assert listener.wait(second.connection, 0.5) is False
    grant = first.acquire(early)
    assert grant is not None and second.acquire(late) is None
    assert first.release(grant)
    assert listener.wait(second.connection, 30) is True
    assert second.acquire(late) is not None


def _slot(limit: int, *, ticket: bool = False) -> LockRequest:
    node = Node("default", Kind.SEMAPHORE, "wake")
    return LockRequest(
        uuid.uuid4().hex, Owner.current(), ((node, Mode.S),), 30, ticket=time.time_ns() if ticket else None,
        holder_limit=limit,
    )  # fmt: skip


def test_a_semaphores_release_wakes_its_first_waiter_and_a_grant_with_slots_left_the_next(pg_config, backend_of):
    """Semaphore waiters wait in S, which no release in S would wake: a slot freed wakes the head of the queue, and
    a grant that leaves a slot free wakes the next waiter (two releases before the head tried again)."""
    holders, first, second = backend_of(pg_config), backend_of(pg_config), backend_of(pg_config)
    held = [holders.acquire(_slot(2)) for _ in range(2)]
    early, late = _slot(2, ticket=True), _slot(2, ticket=True)
    for backend, request in ((first, early), (second, late)):
        assert backend.acquire(request) is None
        backend.wait_release(request, 1, attempt=0)  # starts listening
        assert backend.acquire(request) is None
    assert holders.release(held[0])
    assert listener.wait(first.connection, 30) is True
    assert listener.wait(second.connection, 0.5) is False  # one slot: the head's
    assert holders.release(held[1])  # a second slot, freed before the head took the first
    grant = first.acquire(early)
    assert grant is not None and grant.holder_limit == 2
    assert listener.wait(second.connection, 30) is True  # woken by the head's grant: a slot is left
    assert second.acquire(late) is not None


def test_sqlite_waits_by_backoff(sqlite_store_config, backend_of, monkeypatch):
    """Without notifications each wait() pauses a capped exponential step with jitter, then the caller tries again."""
    from django_esdlock.backends import base

    backend = backend_of(sqlite_store_config)
    assert not backend.supports_notify
    events: list[tuple[str, float]] = []

    class Clock:  # the module's time, with its pauses recorded (and still slept)
        def __getattr__(self, name):
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            events.append(("pause", seconds))
            time.sleep(seconds)

    monkeypatch.setattr(base, "time", Clock())
    holder = backend.acquire(_request("/x"))
    queued = _queued("/x")
    for attempt in range(6):
        assert backend.acquire(queued) is None
        events.append(("refused", attempt))
        assert backend.wait_release(queued, 30.0, attempt) is None
    assert backend.release(holder)
    backend.wait_release(queued, 0.004, 30)  # a step is never longer than what is left of the timeout
    assert backend.acquire(queued) is not None
    assert [kind for kind, _ in events] == ["refused", "pause"] * 6 + ["pause"]
    pauses = [seconds for kind, seconds in events if kind == "pause"]
    for attempt, seconds in enumerate(pauses[:-1]):
        step = base.BACKOFF_INITIAL * 2**attempt
        assert step / 2 <= seconds <= step, (attempt, seconds)
    assert 0 < pauses[-1] <= 0.004


# --- fair waiting ---------------------------------------------------------------


def test_waiting_markers_are_left_refreshed_and_removed(store, backend_of):
    """A queued request's markers: left when refused, gone when it is granted, withdrawn or reaped once expired."""
    backend = backend_of(store)
    backend.marker_ttl = 60
    holder = backend.acquire(_request("/q", "/q/r"))
    assert holder is not None
    plain = _request("/q/r", mode=Mode.S)
    assert backend.acquire(plain) is None
    assert table_counts(store, markers=True) == (2, 2, 0)  # no ticket: nothing left behind
    queued = dataclasses.replace(plain, ticket=time.time_ns())
    assert backend.acquire(queued) is None and backend.acquire(queued) is None  # the second one writes nothing
    assert table_counts(store, markers=True) == (2, 2, 1)
    backend.withdraw(queued)
    assert table_counts(store, markers=True) == (2, 2, 0)
    assert backend.acquire(queued) is None
    assert backend.release(holder)
    grant = backend.acquire(queued)
    assert grant is not None and table_counts(store, markers=True) == (1, 1, 0)  # granted: its marker went
    assert backend.release(grant)
    assert backend.acquire(_request("/elsewhere")) is not None
    blocked = dataclasses.replace(_request("/elsewhere", mode=Mode.S), ticket=time.time_ns())
    assert backend.acquire(blocked) is None and table_counts(store, markers=True)[2] == 1
    backend.evict_expired()
    assert table_counts(store, markers=True)[2] == 1  # still live
    expire(backend, blocked.holder_id, holders=False, markers=True)
    backend.evict_expired(dry_run=True)
    assert table_counts(store, markers=True)[2] == 1
    backend.evict_expired()
    assert table_counts(store, markers=True)[2] == 0
    # A queued request's markers stay while it waits: an attempt past half the marker's lease renews it,
    # one before that writes nothing.
    assert backend.acquire(blocked) is None
    (first,) = backend.wait_state().waiters
    assert backend.acquire(blocked) is None
    assert [w.expires_at for w in backend.wait_state().waiters] == [first.expires_at]
    expire(backend, blocked.holder_id, holders=False, markers=True, by=40)  # 20 s of 60 left
    assert backend.acquire(blocked) is None
    (renewed,) = backend.wait_state().waiters
    assert renewed.expires_at >= first.expires_at > renewed.expires_at - datetime.timedelta(seconds=60)


def test_the_previous_releases_acquire_call_still_runs_after_migration_0006(pg_config, backend_of):
    """A rolling deploy: a process of the release before 0006 calls esdlock_acquire with a boolean p_reentrant."""
    backend = backend_of(pg_config)
    backend.setup()
    node = Node("default", Kind.DOCUMENT, "rolling")
    request = LockRequest(uuid.uuid4().hex, Owner.current(), ((node, Mode.X),), 30, reentrant=True)
    call = next(backend.dialect.acquire_steps(request, [node], backend.marker_ttl_ms))
    statement, params = call.sql, call.params
    assert statement.count("%(reentrant)s::text[]") == 1 and params["reentrant"] == [node.id]
    previous = (
        statement.replace("%(reentrant)s::text[]", "%(reentrant)s::boolean")
        .replace(", %(lock_delay_ms)s::float8, %(holder_limit)s::int", "")  # v6's and v7's came after
        .replace("taken, holder_limit FROM", "taken FROM")
    )
    with psycopg.connect(pg_config["OPTIONS"]["url"], autocommit=True) as connection:
        token, taken = connection.execute(previous, {**params, "reentrant": True}).fetchone()
    assert token > 0 and taken == [node.id]
    assert [h.holder_id for h in all_holders(backend)] == [request.holder_id]


def test_the_previous_releases_acquire_call_still_runs_after_migration_0007(pg_config, backend_of):
    """A rolling deploy: a process of the release before 0007 calls esdlock_acquire without p_lock_delay_ms."""
    backend = backend_of(pg_config)
    backend.setup()
    node = Node("default", Kind.TREE, "/rolling")
    request = LockRequest(uuid.uuid4().hex, Owner.current(), ((node, Mode.X),), 30)
    call = next(backend.dialect.acquire_steps(request, [node], backend.marker_ttl_ms))
    assert call.sql.count(", %(lock_delay_ms)s::float8") == 1 and call.params["lock_delay_ms"] == 0
    previous = call.sql.replace(", %(lock_delay_ms)s::float8, %(holder_limit)s::int", "")  # nor 0008's limit
    previous = previous.replace("taken, holder_limit FROM", "taken FROM")
    with psycopg.connect(pg_config["OPTIONS"]["url"], autocommit=True) as connection:
        token, taken = connection.execute(previous, call.params).fetchone()
    assert token > 0 and taken == [node.id]
    assert [h.holder_id for h in all_holders(backend)] == [request.holder_id]


def test_the_previous_releases_acquire_call_still_runs_after_migration_0008(pg_config, backend_of):
    """A rolling deploy: a process of the release before 0008 calls esdlock_acquire v6, without a holder limit."""
    backend = backend_of(pg_config)
    backend.setup()
    node = Node("default", Kind.DOCUMENT, "rolling-0008")
    request = LockRequest(uuid.uuid4().hex, Owner.current(), ((node, Mode.X),), 30)
    call = next(backend.dialect.acquire_steps(request, [node], backend.marker_ttl_ms))
    statement, params = call.sql, call.params
    previous = statement.replace(", %(holder_limit)s::int", "").replace("taken, holder_limit FROM", "taken FROM")
    assert previous != statement
    with psycopg.connect(pg_config["OPTIONS"]["url"], autocommit=True) as connection:
        token, taken = connection.execute(previous, params).fetchone()
    assert token > 0 and taken == [node.id]
    assert [h.holder_id for h in all_holders(backend)] == [request.holder_id]


def test_the_database_runs_the_current_function_files(pg_config, backend_of):
    """After migrate, PostgreSQL's functions are the latest .sql files (and the overloads v6, v5, v4), byte for byte."""
    backend_of(pg_config).setup()
    with psycopg.connect(url_of(pg_config), autocommit=True) as connection:
        installed = dict(
            connection.execute(
                "SELECT p.oid::regprocedure::text, p.prosrc FROM pg_proc p"
                " WHERE p.proname LIKE 'esdlock%' AND pg_function_is_visible(p.oid)"
            ).fetchall()
        )
    files = {
        signature: function_sql(name, version).split("$$")[1]
        for signature, (name, version) in {
            "esdlock_acquire(text[],text[],text[],text[],text[],integer[],text[],text[],text,jsonb,text,double "
            "precision,jsonb,text[],bigint,double precision,double precision,integer)": (
                "esdlock_acquire",
                CURRENT["esdlock_acquire"],
            ),
            "esdlock_acquire(text[],text[],text[],text[],text[],integer[],text[],text[],text,jsonb,text,double "
            "precision,jsonb,text[],bigint,double precision,double precision)": ("esdlock_acquire", 6),
            "esdlock_acquire(text[],text[],text[],text[],text[],integer[],text[],text[],text,jsonb,text,double "
            "precision,jsonb,text[],bigint,double precision)": ("esdlock_acquire", 5),
            "esdlock_acquire(text[],text[],text[],text[],text[],integer[],text[],text[],text,jsonb,text,double "
            "precision,jsonb,boolean,bigint,double precision)": ("esdlock_acquire", 4),
            "esdlock_release(text,text,jsonb)": ("esdlock_release", CURRENT["esdlock_release"]),
        }.items()
    }
    assert installed == files
