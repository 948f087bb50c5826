"""A store node whose clock runs ahead, on the genuine three-node cluster: the clock-skew margin against it.

A lease is stamped by the clock of the primary that grants or renews it and
judged by the clock of the primary that reads it next. After a failover to a
node whose clock runs ``SKEW`` seconds ahead, every lease the old primary
stamped ends ``SKEW`` seconds early in the store's eyes. A holder that trusts
its lease to its end (``held_for``: the TTL less the lease margin and
``CLOCK_SKEW_MARGIN``) then still writes after a competitor was granted, unless
the margin covers the skew. Node n3's JVM runs under libfaketime
(tests/cluster.py: its wall clock only; its monotonic clock and timed waits
are untouched, as under NTP skew).

Skipped unless ELASTICSEARCH_HOSTS names the cluster of ../shared/elasticsearch/start-cluster.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from django_esdlock.checker.checker import check_history
from django_esdlock.checker.failover import start_cluster_restart
from django_esdlock.checker.history import read_events
from django_esdlock.conf import load_backend

from . import cluster
from .history_workers import take_and_hold
from .peer import setup_django
from .procs import spawned

pytest_plugins = ["django_esdlock.testing"]

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.alone,  # nodes killed and restarted, a node's clock moved: no other test's load beside them
    pytest.mark.skipif(not cluster.hosts(), reason="no ELASTICSEARCH_HOSTS (the three-node cluster)"),
]

SKEWED = 3
"""The node whose clock runs ahead; each lock index's one replica is on it, its primary on another node."""
SKEW = 6
"""Seconds node n3's clock runs ahead (lock_check's run sets a smaller skew of its own, ``CHECK_SKEW``)."""
SAFE_MARGIN = 6.5
"""A CLOCK_SKEW_MARGIN above the skew and the cached clock's 200 ms (lease margin 0.5 + 6.5 ≤ TTL / 4)."""
TTL = 32.0
"""The paused holders' lease: a quarter of it (the cap of the margins) exceeds ``SAFE_MARGIN`` + the lease margin."""
RESUME_AFTER = TTL - SKEW + 0.8
"""When the paused holders resume, after their grant's answer: past the skewed store's end of their lease (TTL - SKEW),
before the end a holder without the margin trusts (TTL - 0.5 after its request, so a window of SKEW - 1.3 s less the
time its grant took), after the end one with it trusts (TTL - 7)."""
CHECK_SKEW, CHECK_MARGIN, CHECK_TTL = 2, 2.5, 12.0
"""lock_check's run: a smaller skew, so that a lease four times the margins (12 s) keeps the run short."""


@pytest.fixture(scope="module")
def skewed_node():
    """The cluster whole, node n3 restarted under libfaketime and its clock set ``SKEW`` s ahead; back to 0 after."""
    if cluster.FAKETIME is None:
        pytest.skip("libfaketime is missing (Debian: apt-get install libfaketime); ./runtests installs it as root")
    cluster.wait_for(3, timeout=240)
    cluster.restart_with_settable_clock(SKEWED)
    try:
        cluster.set_clock_offset(SKEWED, SKEW)
        yield
    finally:
        if cluster.alive(SKEWED):
            cluster.set_clock_offset(SKEWED, 0)
        cluster.make_whole()


@pytest.fixture
def configs(skewed_node):
    with cluster.lock_configs() as make:
        yield make


def primary_off_master_replica_on_skewed(config: dict) -> int:
    """Create ``config``'s lock index with its primary on a node of the right clock that is not the master, and its
    one replica on the skewed node; return the primary's node.

    A template pins the new index to that node (so the primary is there),
    then the index is let onto the skewed node too and the replica recovers
    there: killing the primary's node promotes the skewed one, and the master
    stays (a master's loss adds an election to the failover: seconds more).
    """
    primary = next(i for i in cluster.NODES if i not in (SKEWED, cluster.master_node()))
    index = config["OPTIONS"]["index"]
    template = f"/_template/{index}"
    pinned = {"index.routing.allocation.include._name": f"n{primary}"}
    cluster.request(template, method="PUT", body={"index_patterns": [f"{index}*"], "settings": pinned})
    try:
        backend = load_backend(config)
        backend.setup()
        backend.close()
    finally:
        cluster.request(template, method="DELETE")
    allowed = {"index.routing.allocation.include._name": f"n{primary},n{SKEWED}"}
    cluster.request(f"/{index}/_settings", method="PUT", body=allowed)
    cluster.wait_for(3, status="green", index=index, timeout=60)
    assert cluster.primary_node(index) == primary
    return primary


def test_check_warns_about_the_skewed_node_below_the_margin(configs):
    """W011 on the live cluster: n3 six seconds ahead is past the default margin (0.5 s), within 6.5 s."""
    backend = load_backend(configs(5))
    try:
        (warning,) = backend._clock_warnings()
        assert warning.id == "django_esdlock.W011" and f"node 'n{SKEWED}'" in warning.msg, warning.msg
        backend.clock_skew_margin = SAFE_MARGIN
        assert backend._clock_warnings() == []
    finally:
        backend.close()


def _paused_holder(config: dict, namespace: str, history_path: str) -> dict:
    """Take /file, stop this process (a GC pause) until the test resumes it, then write while the lock is held.

    The history is lock_check's: the checker judges it (each write records
    whether ``lock.lost`` was False when it began).
    """
    setup_django()
    from django_esdlock import lock_tree
    from django_esdlock.checker.history import HistoryWriter
    from django_esdlock.checker.workload import node_list
    from django_esdlock.exceptions import LockBackendUnavailable, LockLost

    backend = load_backend(config)
    lock_tree("/warm-up", namespace=namespace, timeout=30, backend=backend).acquire().release()  # connected: the
    # grant below is stamped within milliseconds of its request, where the holder's own count of its lease starts
    history = HistoryWriter(history_path, f"holder-{os.getpid()}")
    lock = lock_tree("/file", namespace=namespace, timeout=30, backend=backend)
    history.record("invoke", op="holder", kind="tree", api="lock_tree", nodes=node_list(lock.targets), timeout=30)
    lock.acquire()
    history.record("ok", op="holder", holder=lock.holder_id, token=lock.token, pid=os.getpid())
    os.kill(os.getpid(), signal.SIGSTOP)  # the renewer thread stops too: no renewal until the test's SIGCONT
    resumed = time.monotonic()
    while time.monotonic() < resumed + 3:
        valid = not lock.lost
        history.record("write", op="holder", token=lock.token, valid=valid)
        if not valid:
            history.record("lost", op="holder", how="lock.lost")
            break
        time.sleep(0.02)
    valid = not lock.lost
    history.record("release", op="holder", valid=valid)
    outcome = "ok"
    try:
        lock.release()
    except LockLost:
        outcome = "lost"
        history.record("lost", op="holder", how="LockLost at release")
    except LockBackendUnavailable:
        outcome = "store_unavailable"
    history.record("released", op="holder", outcome=outcome)
    backend.close()
    return {"token": lock.token, "release": outcome}


def _granted(path: Path, timeout: float = 60.0) -> tuple[dict, dict]:
    """The holder's 'invoke' and 'ok' events, once its process has stopped itself after the grant."""
    deadline = time.monotonic() + timeout
    while True:
        events = read_events([path]) if path.exists() else []
        ok = [e for e in events if e["type"] == "ok"]
        if ok and Path(f"/proc/{ok[0]['pid']}/stat").read_text().split(") ")[1].startswith("T"):
            return next(e for e in events if e["type"] == "invoke"), ok[0]
        assert time.monotonic() < deadline, f"no paused grant in {path} within {timeout:g}s"
        time.sleep(0.05)


def _competitor_granted(path: Path) -> bool:
    """Whether the competitor whose history is ``path`` has been granted the lock."""
    events = read_events([path]) if path.exists() else []
    return any(e["type"] == "ok" and e["op"] != "holder" for e in events)


def test_a_holder_trusts_its_lease_past_a_skewed_primarys_eviction_only_without_the_margin(configs, tmp_path):
    """Two holders pause right after their grant; the primary that stamped their leases is killed and the skewed
    n3 promoted; competitors wait. At ``RESUME_AFTER``, once its competitor is granted, each holder resumes: n3 has
    evicted both six seconds early.
    Without the margin (0) the holder still trusts its lease and writes beside its competitor: the checker reports
    the overlap. With a margin above the skew it knows its lease is over: the checker finds nothing."""
    cluster.set_clock_offset(SKEWED, SKEW)
    unsafe = configs(TTL, number_of_replicas=1, wait_for_active_shards=1, hosts=cluster.hosts()[: SKEWED - 1])
    primary = primary_off_master_replica_on_skewed(unsafe)
    index = unsafe["OPTIONS"]["index"]
    margins = {"unsafe": 0.0, "safe": SAFE_MARGIN}
    # The holders ask the nodes of the right clock; the competitors the others than the primary's, killed first.
    holders = {name: {**unsafe, "CLOCK_SKEW_MARGIN": margin} for name, margin in margins.items()}
    others = [host for i, host in zip(cluster.NODES, cluster.hosts(), strict=True) if i != primary]
    competitor = {**unsafe, "OPTIONS": {**unsafe["OPTIONS"], "hosts": others}}
    paths = {name: (tmp_path / f"{name}-holder.jsonl", tmp_path / f"{name}-competitor.jsonl") for name in margins}
    holder_args = [(holders[name], f"skew-{name}", str(paths[name][0])) for name in margins]
    with spawned(_paused_holder, holder_args) as paused:
        grants = {name: _granted(paths[name][0]) for name in margins}
        paused.check()
        cluster.kill(primary)
        restarting = cluster.restart(primary)
        competitor_args = [(competitor, f"skew-{name}", str(paths[name][1])) for name in margins]
        with spawned(take_and_hold, competitor_args) as competitors:
            # After the grant's answer: the store stamped the lease before it (so its early end is behind), the
            # holder counts from its request (so its own end is ahead, by the time the grant took). And once its
            # competitor is granted too: resumed before that, the holder learns of the loss from its renewer first
            # (CI once saw a competitor granted 2.9 s late, the failover's requests slow under load), and the one
            # without the margin shows nothing. No later than a second before that one stops trusting its lease.
            for name in sorted(margins, key=lambda name: grants[name][1]["t"]):
                asked, granted = grants[name]
                latest = asked["t"] + TTL - 1.5
                while time.monotonic() < latest and not (
                    time.monotonic() >= granted["t"] + RESUME_AFTER and _competitor_granted(paths[name][1])
                ):
                    competitors.check()
                    time.sleep(0.02)
                os.kill(granted["pid"], signal.SIGCONT)
            competitors.results(timeout=90)
        paused.results(timeout=60)
    cluster.finish(restarting)
    assert cluster.primary_node(index) == SKEWED

    for name in margins:
        events = read_events(paths[name])
        first_competitor_grant = min(e["t"] for e in events if e["type"] == "ok" and e["op"] != "holder")
        asked, granted = grants[name]
        waited = first_competitor_grant - asked["t"]
        took = granted["t"] - asked["t"]
        violations = check_history(events)
        print(f"{name} (CLOCK_SKEW_MARGIN={margins[name]}): granted in {took:.3f}s, competitor granted {waited:.3f}s "
              f"after the request; {[v.message for v in violations]}")  # fmt: skip
        # A holder without the margin trusts its lease until 0.5 s before TTL after its request; it resumes
        # RESUME_AFTER after the grant's answer: a window of SKEW - 1.3 s less the time the grant took.
        assert took < SKEW - 3, f"{name}: the grant took {took:.3f}s, most of the window"
        # The skewed store ended the lease early, by the skew (its cached clock: up to 200 ms late): before a holder
        # without the margin stops trusting it. (When the competitor's answer arrives depends on the machine's load.)
        assert TTL - SKEW - 0.5 < waited < TTL - 0.5, f"{name}: competitor granted {waited:.3f}s after the request"
        if name == "safe":
            assert violations == [], [v.as_dict() for v in violations]
        else:
            assert [v.check for v in violations] == ["a"], [v.as_dict() for v in violations]


def test_lock_check_is_clean_through_a_failover_to_the_skewed_node_with_the_margin_above_the_skew(configs, lock_check):
    """lock_check with the failover fault: the first node it kills is the primary's, and n3 (ahead) takes over."""
    cluster.set_clock_offset(SKEWED, CHECK_SKEW)
    config = configs(CHECK_TTL, number_of_replicas=1, wait_for_active_shards=1)
    config["CLOCK_SKEW_MARGIN"] = CHECK_MARGIN  # lease margin 0.5 + 2.5 = a quarter of the TTL: the cap
    primary = primary_off_master_replica_on_skewed(config)
    result = lock_check(
        config,
        seed=29,
        seconds=12,
        ttl=CHECK_TTL,
        faults=("failover",),
        failover_restart=start_cluster_restart(cluster.START),
    )
    print(result.report())
    assert result.ok, result.report()
    summary = result.summary
    assert summary["faults"]["failover"] >= 1
    assert summary["nodes_killed"][0] == f"n{primary} (primary)", summary["nodes_killed"]
    assert summary["grants"] >= 5 and summary["leftovers"] == 0
