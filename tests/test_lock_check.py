"""lock_check: 0 violations on every real store under every applicable fault; the command and its outputs."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_esdlock.checker import CheckOptions, check_history
from django_esdlock.checker.history import write_history

from .contract import STORES
from .dbstores import sqlite_store

pytest_plugins = ["django_esdlock.testing"]

SHORT = {"seconds": 5.0, "processes": 3, "ttl": 1.0}
"""Short mode: one pause, one kill and (where it applies) one store cut, in a few seconds."""

LONG = {"seconds": 60.0, "processes": 6, "ttl": 1.0}
"""The long run: a minute of every fault the store supports, more processes."""

LINKS = {"seconds": 9.0, "processes": 3, "ttl": 1.0}
"""Short mode of the link, clock and restart faults: each of three injected at least once (1-2 leases each)."""


def run_seed() -> int:
    """ESDLOCK_LOCK_CHECK_SEED to replay a run, else a new seed each run: every run explores another history."""
    given = os.environ.get("ESDLOCK_LOCK_CHECK_SEED")
    seed = int(given) if given else random.SystemRandom().randrange(2**31)
    print(f"lock_check seed {seed} (replay: ESDLOCK_LOCK_CHECK_SEED={seed})")
    return seed


def assert_claims_kept(result, seed: int, *, pauses: int, kills: int) -> None:
    """0 violations, every fault the store supports injected, nothing left held; any failure names the seed."""
    replay = f"seed {seed} (replay: ESDLOCK_LOCK_CHECK_SEED={seed})"
    assert result.ok, f"{replay}\n{result.report()}"
    summary = result.summary
    assert summary["grants"] > 10, f"{replay}: {summary}"
    assert summary["faults"]["pause"] >= pauses and summary["faults"]["kill"] >= kills, f"{replay}: {summary}"
    if "sqlite" in result.backend.lower():
        assert "store" in result.skipped and summary["faults"]["store"] == 0, f"{replay}: {summary}"
    else:
        assert summary["faults"]["store"] >= 1, f"{replay}\n{result.report()}"
    assert summary["leftovers"] == 0, f"{replay}: {summary}"


@pytest.mark.slow  # multi-process, like the stress tests: ./runtests runs it on every store, tox leaves it out
def test_every_store_keeps_its_claims_under_faults(lock_check, store_config):
    seed = run_seed()
    result = lock_check({**store_config, "DEADLOCK_TIMEOUT": 0.3}, seed=seed, **SHORT)  # nested holds: cycles too
    assert_claims_kept(result, seed, pauses=1, kills=1)


@pytest.mark.slow
def test_every_store_keeps_its_claims_for_a_minute_of_every_fault(lock_check, shared_stores, django_db_blocker):
    """The three stores at once, each its own run (workers, proxy, nemesis): a minute of wall clock, not three."""
    seed = run_seed()
    with django_db_blocker.unblock(), ThreadPoolExecutor(len(STORES), thread_name_prefix="lock-check") as pool:
        runs = {
            kind: pool.submit(lock_check, {**shared_stores.get(kind), "DEADLOCK_TIMEOUT": 0.3}, seed=seed, **LONG)
            for kind in STORES
        }
        results = {kind: run.result(timeout=LONG["seconds"] + 240) for kind, run in runs.items()}
    for kind, result in results.items():
        assert kind in result.backend.lower(), result.backend
        assert_claims_kept(result, seed, pauses=3, kills=3)


NETWORK_AND_CLOCK = ("blackhole", "latency", "clock")
"""The faults of links and clocks, in a short run of their own: each is injected at least once."""


@pytest.mark.slow
def test_every_store_keeps_its_claims_under_black_holes_slow_links_and_skewed_clocks(lock_check, store_config):
    seed = run_seed()
    result = lock_check({**store_config, "DEADLOCK_TIMEOUT": 0.3}, seed=seed, faults=NETWORK_AND_CLOCK, **LINKS)
    replay = f"seed {seed} (replay: ESDLOCK_LOCK_CHECK_SEED={seed})"
    assert result.ok, f"{replay}\n{result.report()}"
    summary = result.summary
    assert summary["grants"] > 10 and summary["leftovers"] == 0, f"{replay}: {summary}"
    applies = ["clock"] if "sqlite" in result.backend.lower() else list(NETWORK_AND_CLOCK)
    assert set(result.skipped) == set(NETWORK_AND_CLOCK) - set(applies), result.skipped
    for fault in applies:  # each injected, for about a lease or more
        assert summary["faults"][fault] >= 1 and summary["fault_seconds"][fault] >= 0.9, f"{replay}: {summary}"
    assert f"clock {summary['faults']['clock']} (" in result.report()


@pytest.mark.slow
def test_postgres_restarted_mid_run_keeps_the_claims(lock_check, django_db_blocker):
    """``pg_ctl restart -m immediate`` under the workload: clients cut off, the server recovers, the claims hold.

    On PostgreSQL's own durability settings: a commit is acknowledged once it is on disk (see the next test).
    """
    import psycopg

    from .restartable_postgres import restartable_postgres

    seed = run_seed()
    with django_db_blocker.unblock(), restartable_postgres() as (url, restart):
        with psycopg.connect(url) as connection:
            started = connection.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
        result = lock_check(url, seed=seed, faults=("store-restart",), store_restart=restart, **LINKS)
        with psycopg.connect(url) as connection:
            restarted = connection.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    replay = f"seed {seed} (replay: ESDLOCK_LOCK_CHECK_SEED={seed})"
    assert result.ok, f"{replay}\n{result.report()}"
    summary = result.summary
    assert summary["faults"]["store-restart"] >= 1 and restarted > started, f"{replay}: {summary}"
    assert summary["grants"] > 10 and summary["leftovers"] == 0, f"{replay}: {summary}"
    failed = [e for e in result.events if e["type"] == "store_restarted" and e.get("exitcode") != 0]
    assert not failed, failed


@pytest.mark.slow
def test_the_checker_catches_a_restarted_store_that_lost_acknowledged_commits(lock_check, django_db_blocker):
    """The same run on a server that acknowledges commits before they are on disk: a crash loses some."""
    import psycopg

    from django_esdlock.conf import load_backend

    from .restartable_postgres import restartable_postgres

    seed = run_seed()
    with django_db_blocker.unblock(), restartable_postgres(durable=False) as (url, restart):
        backend = load_backend(url)
        backend.setup()  # the lock tables, on disk before the first crash: what is lost is the run's own commits
        backend.close()
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("CHECKPOINT")
        result = lock_check(url, seed=seed, faults=("store-restart",), store_restart=restart, **LINKS)
    assert result.summary["faults"]["store-restart"] >= 1
    assert not result.ok, f"seed {seed}: no violation on a store that loses commits\n{result.report()}"


def test_store_restart_and_clock_are_skipped_with_a_reason_when_they_cannot_apply(lock_check, sqlite_url, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "time_machine" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    result = lock_check(sqlite_url, seconds=0.5, processes=1, faults=("clock", "store-restart", "blackhole"))
    assert "time-machine" in result.skipped["clock"]
    assert "--store-restart CMD" in result.skipped["store-restart"]
    assert "blackhole" in result.skipped and result.summary["faults"]["blackhole"] == 0
    assert "clock" in result.report() and "skipped" in result.report()


def test_fault_counts_and_lengths_come_from_the_history():
    from django_esdlock.checker.checker import summarize

    events = [
        {"t": 0.0, "type": "blackhole", "process": "nemesis"},
        {"t": 1.5, "type": "flow", "process": "nemesis"},
        {"t": 2.0, "type": "latency", "process": "nemesis"},
        {"t": 3.0, "type": "latency_end", "process": "nemesis"},
        {"t": 3.0, "type": "pause", "victim": "w0", "process": "nemesis"},
        {"t": 3.5, "type": "pause", "victim": "w1", "process": "nemesis"},
        {"t": 4.0, "type": "resume", "victim": "w0", "process": "nemesis"},
        {"t": 4.0, "type": "kill", "victim": "w2", "process": "nemesis"},
        {"t": 5.0, "type": "clock", "offsets": [60.0, -60.0], "process": "nemesis"},
        {"t": 6.0, "type": "resume", "victim": "w1", "process": "nemesis"},
    ]
    summary = summarize(events)
    assert summary["faults"] == {
        "kill": 1, "pause": 2, "store": 0, "blackhole": 1, "latency": 1, "clock": 1, "store-restart": 0,
        "store-failover": 0, "failover": 0,
    }  # fmt: skip
    seconds = summary["fault_seconds"]
    assert (seconds["blackhole"], seconds["latency"], seconds["pause"]) == (1.5, 1.0, 3.5)
    assert seconds["clock"] == 1.0  # still on at the end of the history: counted to its end


def test_the_clock_fault_moves_the_wall_clock_alone():
    import array

    from django_esdlock.checker.workload import ClockSkew

    offsets = array.array("d", [0.0, 0.0])
    clock = ClockSkew(offsets, 1)
    try:
        offsets[1] = -300.0
        wall, steady = time.time(), time.monotonic()
        clock.follow()
        assert abs(time.time() - (wall - 300.0)) < 2.0
        assert abs(time.monotonic() - steady) < 2.0
        time.sleep(0.2)  # timed waits are untouched
        assert time.time() > wall - 300.0 + 0.1  # and the moved clock ticks
        offsets[1] = 0.0
        clock.follow()
        assert abs(time.time() - wall) < 2.0
    finally:
        offsets[1] = 0.0
        clock.follow()


def test_the_proxy_slows_each_way_then_goes_fast_again():
    import socket
    import threading

    from django_esdlock.checker.proxy import Proxy

    server = socket.create_server(("127.0.0.1", 0))

    def echo():
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                while data := conn.recv(100):
                    conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    proxy = Proxy("127.0.0.1", server.getsockname()[1])
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:

            def roundtrip() -> float:
                started = time.monotonic()
                client.sendall(b"x")
                assert client.recv(100) == b"x"
                return time.monotonic() - started

            assert roundtrip() < 0.2
            proxy.slow(0.15, 0.2)
            assert roundtrip() >= 0.3  # both ways: at least 0.15 + 0.15
            proxy.fast()
            assert roundtrip() < 0.2
    finally:
        proxy.close()
        server.close()


@pytest.fixture
def sqlite_url(django_db_blocker):
    with django_db_blocker.unblock(), sqlite_store() as config:
        yield config["OPTIONS"]["url"]


def test_command_prints_a_summary_and_writes_history_json_and_plot(sqlite_url, tmp_path, django_db_blocker):
    history, png = tmp_path / "history.jsonl", tmp_path / "timeline.png"
    out, err = StringIO(), StringIO()
    with django_db_blocker.unblock(), _failing_with(out):
        call_command(
            "lock_check",
            "--backend-url",
            sqlite_url,
            "--processes=2",
            "--seconds=1.5",
            "--ttl=1",
            "--faults=pause,store,failover",
            f"--history={history}",
            f"--plot={png}",
            stdout=out,
            stderr=err,
        )
    text = out.getvalue()
    assert "0 violations" in text, text
    assert "store" in text and "skipped: SQLite is a local file" in text
    assert "skipped: DatabaseLockBackend is not a cluster of nodes that fails over" in text
    assert png.stat().st_size > 1000
    events = [json.loads(line) for line in history.read_text().splitlines()]
    assert {"invoke", "ok", "write", "release", "pause", "resume"} <= {e["type"] for e in events}

    replayed = StringIO()
    call_command("lock_check", f"--replay={history}", "--json", stdout=replayed)
    assert json.loads(replayed.getvalue())["violations"] == []


@contextlib.contextmanager
def _failing_with(out):
    """Fail with the command's output (summary, violations) if it raises."""
    try:
        yield
    except CommandError as e:
        pytest.fail(f"{e}\n{out.getvalue()}")


def _op(op, process, t_invoke, t_ok, t_release, token, node="/a", mode="X", ns="ns"):
    nodes = [[ns, "tree", node, mode]]
    return [
        {"t": t_invoke, "process": process, "type": "invoke", "op": op, "nodes": nodes, "timeout": 1.0},
        {"t": t_ok, "process": process, "type": "ok", "op": op, "holder": op, "token": token},
        {"t": t_ok + 0.01, "process": process, "type": "write", "op": op, "token": token, "valid": True},
        {"t": t_release, "process": process, "type": "release", "op": op, "valid": True},
        {"t": t_release + 0.01, "process": process, "type": "released", "op": op, "outcome": "ok"},
    ]


def test_replay_of_a_violating_history_exits_1_with_its_slice(tmp_path):
    events = sorted(_op("p1-0", "p1", 0.0, 0.1, 1.0, 5) + _op("p2-0", "p2", 0.2, 0.5, 1.5, 6), key=lambda e: e["t"])
    assert {v.check for v in check_history(events)} == {"a"}
    path = tmp_path / "bad.jsonl"
    write_history(events, path)
    out = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("lock_check", f"--replay={path}", stdout=out)
    assert failed.value.returncode == 1
    assert "VIOLATION (a)" in out.getvalue() and "p1-0" in out.getvalue() and "p2-0" in out.getvalue()

    from django_esdlock.management.commands.lock_check import _replay
    from django_esdlock.testing import assert_no_violations

    with pytest.raises(AssertionError, match=r"VIOLATION \(a\)"):
        assert_no_violations(_replay(events, CheckOptions()))


def test_sequential_grants_with_growing_tokens_pass_and_shrinking_ones_fail():
    good = _op("p1-0", "p1", 0.0, 0.1, 1.0, 5) + _op("p2-0", "p2", 0.2, 1.1, 1.5, 6)
    assert check_history(sorted(good, key=lambda e: e["t"])) == []
    bad = _op("p1-0", "p1", 0.0, 0.1, 1.0, 6) + _op("p2-0", "p2", 0.2, 1.1, 1.5, 5)
    assert {v.check for v in check_history(sorted(bad, key=lambda e: e["t"]))} == {"b"}


def test_a_deadlock_victim_must_have_held_something():
    held = _op("p1-0", "p1", 0.0, 0.1, 1.0, 5)
    nested = {"t": 0.2, "process": "p1", "type": "invoke", "op": "p1-1", "nodes": [["ns", "tree", "/b", "X"]]}
    victim = {"t": 0.8, "process": "p1", "type": "fail", "op": "p1-1", "outcome": "deadlock", "error": "cycle"}
    events = sorted([*held, {**nested, "timeout": 5.0, "outer": "p1-0"}, victim], key=lambda e: e["t"])
    assert check_history(events) == []
    alone = sorted([{**nested, "timeout": 5.0}, victim], key=lambda e: e["t"])
    [violation] = check_history(alone)
    assert violation.check == "c" and "held nothing" in violation.message


def test_a_lost_holders_late_write_with_a_stale_token_passes_fencing_and_a_new_one_fails():
    late = {"t": 1.2, "process": "p1", "type": "write", "op": "p1-0", "token": 5, "valid": False}
    lost = {"t": 1.2, "process": "p1", "type": "lost", "op": "p1-0", "how": "lock.lost"}
    first = [e for e in _op("p1-0", "p1", 0.0, 0.1, 1.3, 5) if e["type"] not in ("release", "released")]
    events = sorted([*first, late, lost, *_op("p2-0", "p2", 0.2, 1.1, 1.5, 6)], key=lambda e: e["t"])
    assert check_history(events) == []
    for e in events:
        if e["op"] == "p2-0" and e["type"] == "ok":
            e["token"] = 4
    assert "a" in {v.check for v in check_history(events)}


def test_the_store_fault_proxies_each_kind_of_endpoint(settings):
    """The store fault asks each store its endpoints and its options through the proxies (no store contacted)."""
    from django.db import connections

    from django_esdlock.conf import DATABASE_BACKEND, ELASTICSEARCH_BACKEND, load_backend

    def endpoints(options):
        return load_backend({"BACKEND": backend_path(options), "OPTIONS": options}).endpoints()

    def through(options, ports):
        return load_backend({"BACKEND": backend_path(options), "OPTIONS": options}).options_through(options, ports)

    def backend_path(options):
        return ELASTICSEARCH_BACKEND if "hosts" in options else DATABASE_BACKEND

    es = {"hosts": ["http://es.example:9201"], "index": "locks"}
    assert endpoints(es) == ([("es.example", 9201)], "")
    assert through(es, [4000]) == {"hosts": ["http://127.0.0.1:4000"], "index": "locks"}
    assert endpoints({"hosts": ["https://es.example"]})[0] == []
    cluster = {"hosts": ["http://es1:9200", "http://es2:9200"]}  # one proxy per node
    assert endpoints(cluster) == ([("es1", 9200), ("es2", 9200)], "")
    assert through(cluster, [4000, 4001])["hosts"] == [
        "http://127.0.0.1:4000",
        "http://127.0.0.1:4001",
    ]

    pg = {"url": "postgres://u:p@db.example:6543/app?sslmode=disable"}
    assert endpoints(pg) == ([("db.example", 6543)], "")
    assert through(pg, [4000])["url"] == "postgres://u:p@127.0.0.1:4000/app?sslmode=disable"

    alias = {"using": "postgres"}
    db = connections.settings["postgres"]
    assert endpoints(alias) == ([(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))], "")
    url = through(alias, [4000])["url"]
    assert url.startswith("postgres://") and url.endswith(f"@127.0.0.1:4000/{db['NAME']}")

    targets, why = endpoints({"url": "sqlite:////tmp/locks.sqlite3"})
    assert targets == [] and "SQLite" in why


def test_intents_a_killed_holder_must_be_recovered_with_a_checkpoint_it_made():
    intent = {"op": "django_esdlock.lock_check", "run": "ns", "op_id": "p1-0"}
    held = [e for e in _op("p1-0", "p1", 0.0, 0.1, 9.0, 5) if e["type"] in ("invoke", "ok", "write")]
    held[0]["intent"] = intent
    checkpoint = {"t": 0.3, "process": "p1", "type": "checkpoint", "op": "p1-0", "data": {"step": 3}, "outcome": "ok"}
    kill = {"t": 0.5, "process": "nemesis", "type": "kill", "victim": "p1"}
    events = [*held, checkpoint, kill]
    assert [v.check for v in check_history(events)] == ["e"]  # killed with an intent, never recovered

    def recovered(step, t=2.0):
        return {"t": t, "process": "reaper", "type": "recovered", "intent_op": "p1-0", "checkpoint": {"step": step}}

    assert check_history([*events, recovered(3)]) == []
    assert [v.check for v in check_history([*events, recovered(0)])] == ["e"]  # an older checkpoint
    assert [v.check for v in check_history([*events, recovered(6)])] == ["e"]  # one never made
    # A checkpoint in flight when the reaper took over may be seen before its holder records it.
    in_flight = {**checkpoint, "t": 2.5, "data": {"step": 6}}
    assert check_history([*events, in_flight, recovered(6)]) == []
    # Killed while a checkpoint call was in flight: the store may have it, the holder recorded only its start.
    started = {**checkpoint, "t": 0.45, "data": {"step": 6}, "outcome": "invoked"}
    assert check_history([*events, started, recovered(6)]) == []
    assert check_history([*events, started, recovered(3)]) == []  # or not
    assert [v.check for v in check_history([*events, started, recovered(9)])] == ["e"]


def test_the_proxy_forwards_then_a_cut_fails_connections_at_once_until_restored():
    import socket
    import threading

    from django_esdlock.checker.proxy import Proxy

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)

    def serve(conn):
        with contextlib.suppress(OSError), conn:
            while data := conn.recv(100):
                conn.sendall(data)

    def echo():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    proxy = Proxy("127.0.0.1", server.getsockname()[1])
    try:

        def roundtrip():
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
                client.sendall(b"ping")
                return client.recv(100)

        assert roundtrip() == b"ping"
        held = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        held.sendall(b"a")
        assert held.recv(100) == b"a"
        proxy.cut()
        with pytest.raises(OSError):  # reset, or closed: either fails the request at once
            held.sendall(b"b")
            if held.recv(100) == b"":
                raise ConnectionResetError("closed")
        with pytest.raises(OSError):
            if roundtrip() == b"":
                raise ConnectionResetError("closed")
        proxy.restore()
        assert roundtrip() == b"ping"
        held.close()
    finally:
        proxy.close()
        server.close()


def test_the_failover_fault_applies_only_to_a_cluster_it_can_restart(es_url, sqlite_url, tmp_path):
    from django_esdlock.checker.failover import DEFAULT_KILL, Failover, FailoverCommands
    from django_esdlock.checker.run import _failover
    from django_esdlock.conf import DATABASE_BACKEND, load_backend

    from .stores import es_store

    options = CheckOptions(failover_restart="true")
    sqlite = {"BACKEND": DATABASE_BACKEND, "OPTIONS": {"url": sqlite_url}, "TTL": 30}
    assert _failover(sqlite, load_backend(sqlite), "ns", options, print) == (
        None,
        "DatabaseLockBackend is not a cluster of nodes that fails over",
    )
    with es_store(es_url) as config:
        backend = load_backend(config)
        try:
            failover, why = _failover(config, backend, "ns", options, print)
            # The test server is one node (genuine or noida-db, which answers the nodes API too): that is the
            # reason, not an error of the nodes API.
            assert failover is None and why.startswith("a single Elasticsearch node"), why
            # Three nodes: no restart command, or nodes elsewhere with the default kill, and it is skipped too.
            backend.setup()
            three = Failover(backend, backend.index, FailoverCommands(restart=None), print)
            three.nodes = lambda: {n: _node(n, "127.0.0.1") for n in ("n1", "n2", "n3")}
            assert "--failover-restart" in three.applicable()
            three.commands = FailoverCommands(restart="true", kill=DEFAULT_KILL)
            assert three.applicable() == ""
            three.nodes = lambda: {n: _node(n, "10.9.8.7") for n in ("n1", "n2", "n3")}
            assert "--failover-kill" in three.applicable()
            three.commands = FailoverCommands(restart="true", kill="ssh {host} pkill -9 java")
            assert three.applicable() == ""
        finally:
            backend.close()


def _node(name, host):
    from django_esdlock.checker.failover import _Node

    node = _Node(name, {"name": name, "process": {"id": 42}, "http": {"publish_address": f"{host}:9200"}})
    assert node.fields() == {"node": name, "node_number": name[1:], "pid": 42, "host": host}
    return node


def test_es_hosts_points_the_command_at_a_cluster():
    from django_esdlock.management.commands.lock_check import _config

    config = _config("elasticsearch://es.example:9200/my-locks", "http://a:9200, http://b:9200")
    assert config["OPTIONS"]["hosts"] == ["http://a:9200", "http://b:9200"]
    assert config["OPTIONS"]["index"] == "my-locks"
    assert _config(None, "http://a:9200")["OPTIONS"]["index"] == "locks"
    assert _config("sqlite:////tmp/x.sqlite3", None) == "sqlite:////tmp/x.sqlite3"
    with pytest.raises(ValueError, match="--es-hosts"):
        _config("sqlite:////tmp/x.sqlite3", "http://a:9200")
    with pytest.raises(CommandError, match="--es-hosts"):
        call_command("lock_check", "--backend-url=sqlite:////tmp/x.sqlite3", "--es-hosts=http://a:9200")


# --- the failover fault's care: what it kills, what it runs ------------------------------------------------------

ES_MAIN = "org.elasticsearch.bootstrap.Elasticsearch"


def _fake_node(name="n1", pid=42, host="127.0.0.1"):
    from django_esdlock.checker.failover import _Node

    return _Node(name, {"name": name, "process": {"id": pid}, "http": {"publish_address": f"{host}:9200"}})


@contextlib.contextmanager
def _sleeper(*argv):
    """A process that sleeps with ``argv`` among its arguments; killed after."""
    import subprocess
    import sys

    code = "import time; print('ready', flush=True); time.sleep(120)"
    process = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "ready\n"  # exec'd: /proc shows its own command line (EOF if it died)
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)
        process.stdout.close()


def _failover_without_a_cluster(record):
    """A Failover whose cluster answers are given by the test (its kill and restart are what is tested)."""
    from types import SimpleNamespace

    from django_esdlock.checker.failover import Failover, FailoverCommands

    backend = SimpleNamespace(client=SimpleNamespace(options=lambda **kwargs: None), hosts=["http://127.0.0.1:9"])
    return Failover(backend, "locks", FailoverCommands(restart="true"), record)


def test_the_failover_fault_kills_only_an_elasticsearch_jvm_never_a_group_init_or_itself():
    import os

    from django_esdlock.checker.failover import DEFAULT_KILL, elasticsearch_jvm, kill, refuse_to_kill

    for pid in (0, -1, -os.getpgrp(), 1, os.getpid(), os.getpgrp()):
        assert refuse_to_kill(pid), pid
        assert refuse_to_kill(pid, local=False), pid  # whatever machine the kill command reaches
        with pytest.raises(RuntimeError, match="not killing"):
            kill(_fake_node(pid=pid), "echo {pid}")
    with _sleeper("--not-" + ES_MAIN) as other, _sleeper(ES_MAIN) as es7:
        assert not elasticsearch_jvm(other.pid) and "not an Elasticsearch JVM" in refuse_to_kill(other.pid)
        with pytest.raises(RuntimeError, match="not an Elasticsearch JVM"):
            kill(_fake_node(pid=other.pid))
        with pytest.raises(RuntimeError, match="not an Elasticsearch JVM"):
            kill(_fake_node(pid=other.pid), "kill -KILL {pid}; echo custom")  # {pid} of a node on this machine
        assert other.poll() is None  # still running
        assert refuse_to_kill(other.pid, local=False) == ""  # another machine's pid: only sanity can be checked
        kill(_fake_node(pid=other.pid, host="10.9.8.7"), "true {pid}")  # ... and the command is the user's
        kill(_fake_node(pid=other.pid), "true {node}")  # a command that takes no pid is the user's business
        assert other.poll() is None

        assert elasticsearch_jvm(es7.pid) and refuse_to_kill(es7.pid) == ""
        kill(_fake_node(pid=es7.pid), DEFAULT_KILL)
        assert es7.wait(timeout=10) == -9
    with _sleeper("-m", f"org.elasticsearch.server/{ES_MAIN}") as es8:  # Elasticsearch 8 and 9 start it as a module
        assert elasticsearch_jvm(es8.pid)
    assert not elasticsearch_jvm(2**22 + 7)  # no such process


def test_a_refused_kill_counts_no_failover_and_leaves_nothing_to_restart():
    events = []
    failover = _failover_without_a_cluster(lambda type_, **fields: events.append(type_))
    failover.ready = lambda: True
    failover.primary = lambda: "n1"
    failover.nodes = lambda: {"n1": _fake_node(pid=0)}  # a node whose process id reads 0: a signal to our group
    with pytest.raises(RuntimeError, match="pid 0"):
        failover.inject()
    assert failover.kills == 0 and failover.unrestarted is None and failover.restarting is None and events == []


def test_the_failover_fault_quotes_every_placeholder_it_formats_into_a_shell_command(tmp_path):
    import shlex

    from django_esdlock.checker.failover import kill, shell_command

    name = f"n1'; touch {tmp_path}/pwned; echo '$(touch {tmp_path}/pwned)`touch {tmp_path}/pwned`2"
    host = "h;exit 3&&$(exit 4)`exit 5`"  # a publish address is cut at its last "/"
    node = _fake_node(name=name, host=host)
    out = tmp_path / "out"
    template = "printf '%s\\n' {node} {node_number} {pid} {host} > " + shlex.quote(str(out))
    assert shell_command(template, node).count("touch") == 3

    kill(node, template)  # the kill command of a node elsewhere
    assert out.read_text().splitlines() == [name, "2", "42", host] and not (tmp_path / "pwned").exists()

    out.unlink()
    failover = _failover_without_a_cluster(lambda type_, **fields: None)
    failover.commands = dataclasses.replace(failover.commands, restart=template)
    failover.unrestarted = node
    failover._restart()
    _, process = failover.restarting
    assert process.wait(timeout=30) == 0
    assert out.read_text().splitlines() == [name, "2", "42", host] and not (tmp_path / "pwned").exists()


def test_the_default_kill_recognizes_the_test_servers_process(es_url):
    """The genuine node's pid is an Elasticsearch JVM to the check; noida-db's process is not (and is never killed)."""
    import urllib.request

    from django_esdlock.checker.failover import elasticsearch_jvm

    with urllib.request.urlopen(f"{es_url}/_nodes/process", timeout=10) as answer:
        body = json.load(answer)
    (node,) = body["nodes"].values()
    pid = node.get("process", {}).get("id")
    genuine = node.get("build_hash") != "noida"
    assert elasticsearch_jvm(int(pid or 0)) is genuine
