"""manage.py lock_bench runs end to end in its quick mode and reports every figure; speed is never asserted."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import re

import pytest
from django.core.management import CommandError, call_command

from django_esdlock.bench.common import Figure, format_table, ratio_at_least
from django_esdlock.bench.peers import REDIS_URL, redis_lock, unavailable
from django_esdlock.bench.suite import Options, Report

DEPTHS = (1, 4)
GRAPH_KEYS = {"graph.n100", "graph.n1000", "graph.growth"}
"""The wait-for graph figures of a quick run (no store)."""
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
BENCH_EXTRA = all(importlib.util.find_spec(name) for name in ("tooz", "redis", "redis_lock", "psycopg2"))
"""The [bench] extra (lock_bench --peers): installed by .ci/run, not by .[dev]."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def verdict(figure: dict) -> bool | None:
    """The ``met`` a figure must report, worked out from its goal's text and its numbers (None: no goal)."""
    goal = figure["goal"]
    if goal is None:
        return None
    value_goal = re.fullmatch(r"[<≤] ([0-9.]+) (s|ms)", goal)  # a value goal, in seconds: "< 1 s", "≤ 5 ms"
    if value_goal:
        return figure["value"] <= float(value_goal[1]) * (0.001 if value_goal[2] == "ms" else 1)
    ratio = figure["value"] / figure["baseline"]
    if goal == "= depth 1":  # round trips per acquire at depth d, no more than at depth 1
        return ratio <= 1
    limit = float(goal[2:-1])  # a ratio goal: "≥ 5x", "≤ 2x"
    return ratio >= limit if goal.startswith("≥") else ratio <= limit


def expected_keys(store: str) -> set[str]:
    baselines = {
        "elasticsearch": ("raw", "raw_bulk", "naive", "scripted"),
        "postgres": ("row", "advisory"),
        "sqlite": ("row",),
    }[store]
    return {
        *(f"{store}.pair.d{d}.vs_{b}" for d in DEPTHS for b in baselines),
        *(f"{store}.requests.d{d}" for d in DEPTHS),
        f"{store}.wakeup.p50",
        f"{store}.wakeup.p50_vs_idle",
        f"{store}.wakeup.p99",
        f"{store}.global.pair.vs_{baselines[0]}",
        f"{store}.global.contention",
        f"{store}.semaphore.pair.vs_mutex",
        f"{store}.semaphore.contention",
        f"{store}.contention.pairs",
        f"{store}.contention.longest_wait",
        f"{store}.contention.own_leaves",
        f"{store}.writer_wait",
        f"{store}.deadlock.p50",
        f"{store}.deadlock.p99",
        f"{store}.reap",
        f"{store}.admin_changelist",
        f"{store}.admin_waiting",
        f"{store}.async.pair",
        f"{store}.async.tasks",
        f"{store}.async.wakeup.p50",
        # fenced_update against QuerySet.update: the rows of a SQL store only
        *((f"{store}.fencing.rows1", f"{store}.fencing.rows100") if store != "elasticsearch" else ()),
        f"{store}.observability.pair",
        f"{store}.observability.sampled_pair",
    }


@pytest.fixture
def _lock_connections(django_db_blocker):
    """The lock backends open connections of their own; pytest-django blocks them unless told."""
    with django_db_blocker.unblock():
        yield


@pytest.mark.timeout(600)  # the suite's one lock_bench run: both stores and, with [bench], two peer locks
@pytest.mark.alone  # a benchmark shares the machine and the genuine node with no other test (its heap's breaker)
@pytest.mark.usefixtures("_lock_connections")
def test_quick_run_reports_every_figure_next_to_its_baseline(es_url, tmp_path):
    png = tmp_path / "bench.png"
    out = io.StringIO()
    args = ["--quick", "--json", "--workers", "4", "--depth", ",".join(map(str, DEPTHS)), "--es-url", es_url, "--peers"]
    call_command(
        "lock_bench", *args, *(["--plot", str(png)] if HAS_MATPLOTLIB else []), stdout=out, stderr=io.StringIO()
    )

    report = json.loads(out.getvalue())
    assert report["errors"] == []
    figures = {f["key"]: f for f in report["figures"]}
    peers = {key: figures.pop(key) for key in list(figures) if ".peer." in key}
    assert set(figures) == expected_keys("elasticsearch") | expected_keys("postgres") | GRAPH_KEYS
    for key, figure in figures.items():
        assert figure["value"] is not None and figure["baseline"] is not None, key
        assert figure["baseline"] > 0, (key, figure, report["facts"])  # a run that measured nothing says what
        assert math.isclose(figure["ratio"], figure["value"] / figure["baseline"], rel_tol=1e-3), (key, figure)
        # The verdict follows from the reported numbers: a goal "≥ 5x" is met exactly when the ratio is at least 5.
        assert figure["met"] == verdict(figure), (key, figure)
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
        assert tasks["goal"] == "≥ 5x" and tasks["extra"]["tasks"] == 100
        assert tasks["met"] == (tasks["value"] / tasks["baseline"] >= 5), tasks
        assert tasks["baseline"] == figures[f"{store}.async.pair"]["value"]
    # --peers: the locks users would otherwise pick, measured beside ours on PostgreSQL (the [bench] extra).
    if not BENCH_EXTRA:
        assert peers and all("not installed" in figure["note"] for figure in peers.values()), peers
        pytest.skip("the [bench] extra is not installed: lock_bench --peers measured no peer")
    assert set(peers) == {
        f"postgres.peer.{p}.{f}" for p in ("tooz_pg", "redis_lock") for f in ("pair", "contention")
    }, f"a peer was not measured (Redis at {os.environ.get('REDIS_URL', REDIS_URL)}?): {peers}"
    for key, figure in peers.items():
        assert figure["value"] > 0 and figure["baseline"] > 0, (key, figure)
        assert figure["met"] == verdict(figure), (key, figure)
    assert peers["postgres.peer.tooz_pg.contention"]["goal"] == "≥ 1x"


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


def test_a_peer_that_cannot_be_reached_is_skipped_with_the_reason():
    """What ``--peers`` shows for a peer it cannot measure (the figure ``postgres.peer.<key>.skipped``)."""
    nowhere = redis_lock("redis://127.0.0.1:9/0")  # nothing listens there
    reason = unavailable(nowhere)
    expected = "not reachable at redis://127.0.0.1:9/0" if BENCH_EXTRA else "not installed (redis"
    assert reason.startswith(expected), reason


def test_only_the_named_figures_are_measured():
    out = io.StringIO()
    call_command("lock_bench", "--only", "graph", "--quick", "--json", stdout=out, stderr=io.StringIO())
    report = json.loads(out.getvalue())
    assert report["errors"] == [] and {f["key"] for f in report["figures"]} == GRAPH_KEYS
    assert "wake_floor" not in report["facts"]  # no worker process was started
    with pytest.raises(CommandError, match="--only"):
        call_command("lock_bench", "--only", "graph,nothing", stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.usefixtures("_lock_connections")
def test_fencing_figures_hold_fenced_update_against_a_plain_update_on_both_sql_stores():
    figures = {}
    for store in ("postgres", "sqlite"):
        out = io.StringIO()
        call_command("lock_bench", "--backend", store, "--only", "fencing", "--quick", "--json", stdout=out)
        report = json.loads(out.getvalue())
        assert report["errors"] == []
        figures.update({f["key"]: f for f in report["figures"]})
    assert set(figures) == {f"{s}.fencing.rows{n}" for s in ("postgres", "sqlite") for n in (1, 100)}
    for key, figure in figures.items():
        assert figure["value"] > 0 and figure["baseline"] > 0 and figure["baseline_label"] == "QuerySet.update", key
        assert figure["met"] == verdict(figure), (key, figure)
    assert figures["postgres.fencing.rows1"]["goal"] == "≥ 0.91x"


@pytest.mark.usefixtures("_lock_connections")
def test_semaphore_figures_hold_a_semaphore_pair_against_a_mutex_pair_and_never_see_more_than_its_limit():
    out = io.StringIO()
    call_command(
        "lock_bench", "--backend", "sqlite", "--only", "semaphore", "--quick", "--workers", "4", "--json", stdout=out
    )
    report = json.loads(out.getvalue())
    assert report["errors"] == []
    figures = {f["key"]: f for f in report["figures"]}
    assert set(figures) == {"sqlite.semaphore.pair.vs_mutex", "sqlite.semaphore.contention"}
    pair = figures["sqlite.semaphore.pair.vs_mutex"]
    assert pair["goal"] == "≥ 0.9x" and pair["met"] == verdict(pair)
    assert 1 <= figures["sqlite.semaphore.contention"]["extra"]["most_at_once"] <= 3


@pytest.mark.usefixtures("_lock_connections")
def test_the_observability_figure_holds_pairs_with_metrics_and_spans_on_against_off():
    out = io.StringIO()
    call_command("lock_bench", "--backend", "sqlite", "--only", "observability", "--quick", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["errors"] == []
    figure, sampled = report["figures"]
    assert figure["key"] == "sqlite.observability.pair" and figure["baseline_label"] == "both off"
    assert sampled["key"] == "sqlite.observability.sampled_pair" and sampled["baseline"] == figure["baseline"]
    for each in (figure, sampled):
        assert each["value"] > 0 and each["baseline"] > 0 and each["goal"] == "≥ 0.97x"
        assert each["met"] == verdict(each)
        assert each["extra"]["metrics"] and each["extra"]["spans_recorded"]


@pytest.mark.usefixtures("_lock_connections")
def test_the_dashboard_panels_are_drawn_from_a_workload(tmp_path):
    picture = tmp_path / "dashboard.png"
    out = io.StringIO()
    call_command("lock_bench", "--backend", "sqlite", "--dashboard", str(picture), "--quick", stdout=out, stderr=out)
    assert picture.read_bytes().startswith(b"\x89PNG") and f"wrote {picture}" in out.getvalue()
