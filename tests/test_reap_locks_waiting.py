"""reap_locks reports the requests waiting now and the deadlocks among them, on every store."""

from __future__ import annotations

import io
import json
import time

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_esdlock.modes import Mode

from .dbstores import sqlite_store
from .waiting_state import hold, leave_a_deadlock, wait


@pytest.fixture
def lock_config(store_config):
    return store_config


def reap(config, *args: str, **options) -> str:
    out = io.StringIO()
    with override_settings(LOCK_BACKEND=config):
        call_command("reap_locks", *args, stdout=out, **options)
    return out.getvalue()


def test_json_reports_waiting_edges_and_cycles(lock_config, backend):
    quiet = json.loads(reap(lock_config, "--json"))
    assert quiet["waiting"] == {"supported": True, "error": None, "requests": [], "edges": [], "cycles": []}
    assert quiet["counts"]["cycles"] == quiet["counts"]["waiting_edges"] == 0

    victim = leave_a_deadlock(backend)
    hold(backend, "carol", "/q", Mode.S, namespace="other")
    wait(backend, "dave", "/q", Mode.X, ticket=time.time_ns(), namespace="other")
    report = json.loads(reap(lock_config, "--json"))
    # The reaper's keys are all still there.
    assert {"dry_run", "evicted", "dead_local", "recovered", "failed", "unrecoverable", "to_recover"} <= set(report)
    assert report["counts"]["evicted"] == 0
    waiting = report["waiting"]
    assert waiting["supported"] is True and waiting["error"] is None
    assert {(r["holder_id"], r["owner"]["thread_name"]) for r in waiting["requests"]} == {
        ("alice-waits", "alice"),
        ("bob-waits", "bob"),
        ("dave-waits", "dave"),
    }
    (dave,) = [r for r in waiting["requests"] if r["holder_id"] == "dave-waits"]
    assert dave["waits_for"] == [{"namespace": "other", "kind": "tree", "path": "/q", "mode": "X"}]
    fields = ("waiter", "path", "mode", "blocker", "blocker_mode", "queued")
    assert {tuple(e[f] for f in fields) for e in waiting["edges"]} == {
        ("alice-waits", "/b", "X", "bob-holds", "X", False),
        ("bob-waits", "/a", "X", "alice-holds", "X", False),
        ("dave-waits", "/q", "X", "carol-holds", "S", False),
    }
    (cycle,) = waiting["cycles"]
    assert cycle["victim"] == victim == "bob-waits"
    assert sorted(cycle["requests"]) == ["alice-waits", "bob-waits"] and len(cycle["edges"]) == 2
    counts = report["counts"]
    assert (counts["waiting_requests"], counts["waiting_edges"], counts["cycles"]) == (3, 3, 1)
    # --namespace keeps what touches that namespace.
    other = json.loads(reap(lock_config, "--json", "--namespace", "other"))["waiting"]
    assert [e["waiter"] for e in other["edges"]] == ["dave-waits"] and other["cycles"] == []
    fs = json.loads(reap(lock_config, "--json", "--namespace", "fs"))["waiting"]
    assert len(fs["edges"]) == 2 and [c["victim"] for c in fs["cycles"]] == ["bob-waits"]


def test_human_output_names_waiting_requests_and_the_deadlock(lock_config, backend):
    assert "waiting" not in reap(lock_config)
    victim = leave_a_deadlock(backend)
    out = reap(lock_config)
    assert "Removed 0 expired holder(s)." in out
    assert "2 request(s) waiting, 2 wait-for edge(s), 1 deadlock(s)." in out
    assert f"Deadlock between 2 requests, victim {victim} of " in out and " bob:" in out
    verbose = reap(lock_config, verbosity=2)
    assert "  alice-waits waits for X on fs:/b, held by bob-holds (X, owner " in verbose
    assert reap(lock_config, verbosity=0) == ""


def test_a_store_that_cannot_list_waiters(django_db_blocker):
    with django_db_blocker.unblock(), sqlite_store() as config:
        config = {**config, "BACKEND": "tests.waiting_state.NoWaitStateBackend"}
        report = json.loads(reap(config, "--json"))
        assert report["waiting"]["supported"] is False and "cannot list waiting" in report["waiting"]["error"]
        assert report["waiting"]["edges"] == [] and report["counts"]["cycles"] == 0
        assert reap(config) == "Removed 0 expired holder(s).\n"
        assert "cannot list waiting requests" in reap(config, verbosity=2)


def test_the_first_rows_are_shown_and_the_rest_counted(lock_config, backend):
    backend.marker_ttl = 60
    now = time.time_ns()
    hold(backend, "holder", "/crowd")
    for i in range(4):
        wait(backend, f"c{i}", "/crowd", ticket=now + i)
    for pair, (first, second) in enumerate((("alice", "bob"), ("carol", "dave"))):
        hold(backend, first, f"/{first}")
        hold(backend, second, f"/{second}")
        wait(backend, first, f"/{second}", ticket=now - 10_000_000_000 + pair, holds=True)
        wait(backend, second, f"/{first}", ticket=now - 5_000_000_000 + pair, holds=True)
    # 8 requests; edges: the crowd's 4 on its holder and 3 queued (each behind the one before), 4 in the cycles.
    report = json.loads(reap(lock_config, "--json", "--waiting-limit", "2"))
    waiting, counts = report["waiting"], report["counts"]
    assert set(waiting) == {"supported", "error", "requests", "edges", "cycles"}
    assert [r["holder_id"] for r in waiting["requests"]] == ["alice-waits", "carol-waits"]  # the oldest
    assert len(waiting["edges"]) == 2 and len(waiting["cycles"]) == 2
    assert (counts["waiting_requests"], counts["waiting_edges"], counts["cycles"]) == (8, 11, 2)
    assert (counts["waiting_requests_shown"], counts["waiting_edges_shown"], counts["cycles_shown"]) == (2, 2, 2)
    assert report["waiting_limit"] == 2 and report["waiting_truncated"] is True
    everything = json.loads(reap(lock_config, "--json", "--waiting-limit", "0"))
    assert len(everything["waiting"]["requests"]) == 8 and len(everything["waiting"]["edges"]) == 11
    assert everything["waiting_limit"] is None and everything["waiting_truncated"] is False
    default = json.loads(reap(lock_config, "--json"))
    assert default["waiting_limit"] == 100 and default["waiting_truncated"] is False
    assert default["waiting"] == everything["waiting"]
    # Text: the first deadlock, the first edges at verbosity 2, and how many more.
    out = reap(lock_config, "--waiting-limit", "1", verbosity=2)
    assert "8 request(s) waiting, 11 wait-for edge(s), 2 deadlock(s)." in out
    assert out.count("Deadlock between 2 requests") == 1
    assert "... and 1 more deadlock(s) not shown (--waiting-limit 1; 0 for all)." in out
    assert out.count(" waits for X on ") == 1 + 2  # one edge line, and one in each deadlock's description
    assert "... and 10 more wait-for edge(s) not shown" in out
    with pytest.raises(CommandError):
        reap(lock_config, "--waiting-limit", "-1")
