"""manage.py lock_bench runs end to end in its quick mode and reports every figure; speed is never asserted."""

from __future__ import annotations

import importlib.util
import io
import json
import math

import pytest
from django.core.management import CommandError, call_command

from django_esdlock.bench.common import Figure, format_table, ratio_at_least
from django_esdlock.bench.suite import Options, Report

DEPTHS = (1, 4)
GRAPH_KEYS = {"graph.n100", "graph.n1000", "graph.growth"}
"""The wait-for graph figures of a quick run (no store)."""
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def expected_keys(store: str) -> set[str]:
    baselines = {"elasticsearch": ("raw", "naive"), "postgres": ("row", "advisory"), "sqlite": ("row",)}[store]
    return {
        *(f"{store}.pair.d{d}.vs_{b}" for d in DEPTHS for b in baselines),
        *(f"{store}.requests.d{d}" for d in DEPTHS),
        f"{store}.wakeup.p50",
        f"{store}.wakeup.p50_vs_idle",
        f"{store}.wakeup.p99",
        f"{store}.global.pair.vs_{baselines[0]}",
        f"{store}.global.contention",
        f"{store}.contention.pairs",
        f"{store}.contention.longest_wait",
        f"{store}.writer_wait",
        f"{store}.deadlock.p50",
        f"{store}.deadlock.p99",
        f"{store}.reap",
        f"{store}.admin_changelist",
        f"{store}.admin_waiting",
        f"{store}.async.pair",
        f"{store}.async.tasks",
        f"{store}.async.wakeup.p50",
    }


@pytest.fixture
def _lock_connections(django_db_blocker):
    """The lock backends open connections of their own; pytest-django blocks them unless told."""
    with django_db_blocker.unblock():
        yield


@pytest.mark.usefixtures("_lock_connections")
def test_quick_run_reports_every_figure_next_to_its_baseline(es_url, tmp_path):
    png = tmp_path / "bench.png"
    out = io.StringIO()
    args = ["--quick", "--json", "--workers", "4", "--depth", ",".join(map(str, DEPTHS)), "--es-url", es_url]
    call_command(
        "lock_bench", *args, *(["--plot", str(png)] if HAS_MATPLOTLIB else []), stdout=out, stderr=io.StringIO()
    )

    report = json.loads(out.getvalue())
    assert report["errors"] == []
    figures = {f["key"]: f for f in report["figures"]}
    assert set(figures) == expected_keys("elasticsearch") | expected_keys("postgres") | GRAPH_KEYS
    for key, figure in figures.items():
        assert figure["value"] is not None and figure["baseline"] is not None, key
        assert figure["baseline"] > 0 and math.isclose(
            figure["ratio"], figure["value"] / figure["baseline"], rel_tol=1e-3
        )
    # Exact, not timed: one bulk per acquire on Elasticsearch, the same round trips at every depth on PostgreSQL.
    assert figures["elasticsearch.requests.d4"]["value"] == 1
    assert figures["postgres.requests.d4"]["value"] == figures["postgres.requests.d1"]["value"]
    # The reaper removed every filled holder; the admin showed a first page, not everything.
    assert figures["postgres.reap"]["extra"]["evicted"] == report["options"]["reap_count"]
    assert figures["elasticsearch.reap"]["extra"]["evicted"] == report["options"]["reap_count"]
    assert figures["postgres.admin_changelist"]["extra"]["paged"] is True
    assert figures["elasticsearch.admin_changelist"]["extra"]["paged"] is True
    # The waiting page read every real waiting request and their deadlock, and showed the first 100 rows.
    for store in ("elasticsearch", "postgres"):
        waiting = figures[f"{store}.admin_waiting"]
        count = report["options"]["waiting_count"]
        assert waiting["note"] == "" and waiting["extra"]["status"] == 200
        assert (waiting["extra"]["waiting"], waiting["extra"]["deadlocks"]) == (count + 1, 1)
        assert (waiting["extra"]["rows"], waiting["extra"]["more_requests"]) == (100, count + 1 - 100)
    # The graph figures: one deadlock of the whole crowd, the same victim; the quadratic edges counted beside.
    for size in (100, 1000):
        graph = figures[f"graph.n{size}"]["extra"]
        assert (graph["requests"], graph["deadlocks"], graph["deadlocked_owners"]) == (size + 1, 1, size + 1)
        assert graph["victim"] == "request-b" and graph["quadratic_edges"] > size * size / 4
    assert figures["graph.growth"]["baseline"] == figures["graph.n100"]["value"]
    if HAS_MATPLOTLIB:
        assert png.read_bytes().startswith(PNG_SIGNATURE)
    # Every round of the deadlock figure had exactly one victim, which cannot give up before the deadlock timeout.
    for store in ("elasticsearch", "postgres"):
        deadlock = figures[f"{store}.deadlock.p50"]
        assert deadlock["baseline"] == report["options"]["deadlock_timeout"] == 0.2
        assert deadlock["extra"]["rounds"] == report["options"]["deadlock_rounds"]
        assert deadlock["extra"]["without_one_victim"] == 0 and deadlock["ratio"] >= 1
    # The async figures: many tasks held against one, with the goal on the stores with native async I/O.
    for store in ("elasticsearch", "postgres"):
        tasks = figures[f"{store}.async.tasks"]
        assert tasks["goal"] == "≥ 5x" and tasks["met"] in (True, False) and tasks["extra"]["tasks"] == 100
        assert tasks["baseline"] == figures[f"{store}.async.pair"]["value"]


@pytest.mark.usefixtures("_lock_connections")
def test_sqlite_is_measured_when_named(tmp_path):
    out = io.StringIO()
    args = ["--backend", "sqlite", "--quick", "--json", "--workers", "2", "--depth", ",".join(map(str, DEPTHS))]
    call_command("lock_bench", *args, "--tasks", "20", stdout=out, stderr=io.StringIO())
    report = json.loads(out.getvalue())
    assert report["errors"] == []
    figures = {f["key"]: f for f in report["figures"]}
    assert set(figures) == expected_keys("sqlite") | GRAPH_KEYS
    assert figures["sqlite.admin_waiting"]["extra"]["waiting"] == report["options"]["waiting_count"] + 1
    assert figures["sqlite.reap"]["extra"]["evicted"] == report["options"]["reap_count"]
    assert figures["sqlite.async.tasks"]["goal"] is None and figures["sqlite.async.tasks"]["extra"]["tasks"] == 20
    assert report["facts"]["sqlite"]["journal_mode"] == "wal"
    assert figures["sqlite.deadlock.p50"]["extra"]["without_one_victim"] == 0


@pytest.mark.usefixtures("_lock_connections")
def test_a_store_that_cannot_be_set_up_fails_the_command():
    out = io.StringIO()
    with pytest.raises(CommandError, match="could not be measured"):
        call_command(
            "lock_bench",
            "--quick",
            "--backend",
            "postgres",
            "--workers",
            "1",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/nowhere",
            stdout=out,
            stderr=io.StringIO(),
        )
    assert "postgres setup failed" in out.getvalue()


def test_table_puts_each_figure_beside_its_baseline_and_goal():
    figures = [
        Figure(
            "es.pair",
            "elasticsearch",
            "tree lock pairs/s, depth 4",
            300.0,
            "/s",
            "raw pair",
            400.0,
            ratio_at_least(0.8),
        ),
        Figure("pg.wait", "postgres", "writer wait", 0.004, "s", "longest hold", float("nan")),
    ]
    lines = format_table(figures).splitlines()
    assert "300/s" in lines[2] and "400/s" in lines[2] and "0.75x" in lines[2] and "MISSED" in lines[2]
    assert "4.00 ms" in lines[4] and "n/a" in lines[4]


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from django_esdlock.bench.plot import plot

    figures = [
        Figure(f"{store}.pair.d{d}.vs_{b}", store, f"tree lock pairs/s, depth {d}", 100.0 / d, "/s", b, 200.0)
        for store, baselines in (("elasticsearch", ("raw", "naive")), ("postgres", ("row", "advisory")))
        for b in baselines
        for d in DEPTHS
    ]
    png = tmp_path / "chart.png"
    plot(Report(Options(depths=DEPTHS), figures, facts={"cpus": 2}), str(png))
    assert png.read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.usefixtures("_lock_connections")
def test_peers_are_measured_beside_ours_or_skipped_with_a_reason(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:9/0")  # nothing listens there: must be skipped, not fail
    out = io.StringIO()
    args = ["--backend", "postgres", "--quick", "--json", "--workers", "2", "--depth", "1", "--peers"]
    call_command("lock_bench", *args, stdout=out, stderr=io.StringIO())
    report = json.loads(out.getvalue())
    assert report["errors"] == []
    figures = {f["key"]: f for f in report["figures"]}
    try:
        import redis  # noqa: F401
        import redis_lock  # noqa: F401
    except ImportError:  # the [bench] extra is not installed
        assert "not installed" in figures["postgres.peer.redis_lock.skipped"]["note"]
    else:
        assert "not reachable" in figures["postgres.peer.redis_lock.skipped"]["note"]
    try:
        import tooz  # noqa: F401
    except ImportError:
        assert "not installed" in figures["postgres.peer.tooz_pg.skipped"]["note"]
    else:
        contention = figures["postgres.peer.tooz_pg.contention"]
        assert contention["baseline"] > 0 and contention["goal"] is not None
        assert figures["postgres.peer.tooz_pg.pair"]["baseline"] > 0


def test_only_the_named_figures_are_measured():
    out = io.StringIO()
    call_command("lock_bench", "--only", "graph", "--quick", "--json", stdout=out, stderr=io.StringIO())
    report = json.loads(out.getvalue())
    assert report["errors"] == [] and {f["key"] for f in report["figures"]} == GRAPH_KEYS
    assert "wake_floor" not in report["facts"]  # no worker process was started
    with pytest.raises(CommandError, match="--only"):
        call_command("lock_bench", "--only", "graph,nothing", stdout=io.StringIO(), stderr=io.StringIO())
