"""Partitions of a genuine three-node Elasticsearch cluster while lock_check's workload runs: 0 violations.

Each node runs in a network namespace of its own (tests/netns_cluster.py); packets between nodes
are dropped by tc, never refused, while the clients in the root namespace reach every node. Three
cases, the nodes chosen from the live roles (the lock index's primary is moved off the master
first, so that each case cuts one role): the primary's node isolated, the master isolated, and a
non-transitive bridge (the primary's node and the third node cut from each other, both still
seeing the master). Run with ``-s`` to see each case's grants, errors and loss reports.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from django_esdlock.checker import CheckOptions, run_check
from django_esdlock.checker.checker import check_history
from django_esdlock.checker.history import read_events
from django_esdlock.conf import load_backend

from . import netns_cluster
from .history_workers import take_and_hold
from .procs import run_processes
from .stores import ES_BACKEND

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.alone,  # three more JVMs and cuts that stall writes for seconds: no other test's load beside them
    pytest.mark.skipif(bool(netns_cluster.missing()), reason=netns_cluster.missing() or "-"),
]

TTL = 2.0
"""The workload's lease: every cut outlasts several."""
LEAD = 3.0
"""Seconds of workload before the cut."""
CUT = 14.0
"""Seconds a node stays cut off: the others notice in 3-11 s (netns_cluster.FAULT_DETECTION, an election included)."""
BRIDGE_CUT = 20.0
"""Seconds the bridge's cut lasts: no check notices it, only a replication stuck on the silent peer, which fails when
TCP gives up on it, about 13 s after its first unanswered packet (netns_cluster.TCP_RETRIES2)."""
PROBE = 2.0
"""Seconds at the end of a cut that the reachability probe may take."""
SETTLE = 7.0
"""Seconds of workload after the heal: the cut-off node rejoins and grants go on."""
START_TIMEOUT = 150.0


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory):
    """The cluster, built once for the module and removed at its end, a failed test or an interrupt included.

    The nodes' logs are kept in pytest's temporary directory (the last three runs are kept).
    """
    cluster = netns_cluster.NetnsCluster()
    logs = tmp_path_factory.mktemp("partition-logs")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop(keep_logs=logs)
        print(f"\nthe partition cluster's node logs: {logs}")


@pytest.fixture
def whole(partitioned):
    """The cluster with no cut and three nodes before the test, healed and whole again after it."""
    partitioned.heal()
    partitioned.wait_for_nodes(3, timeout=90)
    yield partitioned
    partitioned.heal()
    partitioned.wait_for_nodes(3, timeout=90)


def _roles(cluster: netns_cluster.NetnsCluster, index: str) -> dict[str, int]:
    """The master, the lock index's primary (moved off the master if it is there) and the third node."""
    cluster.wait_for_nodes(3, status="green", index=index, timeout=60)
    master = cluster.master()
    if cluster.primary(index) == master:
        cluster.move_primary_off(index, master)
    primary = cluster.primary(index)
    (third,) = set(netns_cluster.NODES) - {master, primary}
    return {"master": master, "primary": primary, "third": third}


class Partition(threading.Thread):
    """Wait for the workload to start, cut, watch what the nodes say while the cut lasts, heal.

    ``cut`` makes the partition; ``noticed(views, copies)`` says whether the
    cluster has reacted, from every node's own view and the lock index's
    shard copies as node ``watch`` (one that stays with the majority) has them.
    """

    def __init__(self, cluster: netns_cluster.NetnsCluster, index: str, cut, noticed, watch: int, seconds) -> None:
        super().__init__(name="partition", daemon=True)
        self.cluster, self._cut, self._noticed, self.watch, self.seconds = cluster, cut, noticed, watch, seconds
        self.index = cluster.concrete(index)  # asked now: the alias is resolved by the master, which may be cut off
        self.started = threading.Event()
        self.out: dict[str, Any] = {"samples": []}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            assert self.started.wait(START_TIMEOUT), "the workload did not start"
            time.sleep(LEAD)
            self._cut()
            self.out["cut_at"] = cut_at = time.monotonic()
            while time.monotonic() < cut_at + self.seconds - PROBE:
                with ThreadPoolExecutor(3) as pool:
                    asked = {i: pool.submit(self.cluster.local_view, i, 2.0) for i in netns_cluster.NODES}
                views = {}
                for i, answer in asked.items():
                    try:
                        views[i] = answer.result(timeout=30)
                    except AssertionError as e:  # a node busy or stalled: say so, the cut goes on
                        views[i] = {"error": str(e)[:200]}
                try:
                    shards = self.cluster.routing(self.index, self.watch)
                except (AssertionError, KeyError) as e:
                    shards = [("error", str(e)[:200])]
                at = round(time.monotonic() - cut_at, 1)
                self.out["samples"].append((at, views, shards))
                if "noticed_after" not in self.out and self._noticed(views, shards):
                    self.out["noticed_after"] = at
                time.sleep(max(0.0, min(1.0, cut_at + self.seconds - PROBE - time.monotonic())))
            # Which transport ports each namespace reaches, at the end of the cut (the cut itself, not what the nodes
            # made of it): a connection attempt that gets no answer within the probe's timeout is cut.
            with ThreadPoolExecutor(6) as pool:
                probes = {f"n{a}->n{b}": pool.submit(self.cluster.reaches, a, b) for a, b in _pairs()}
                self.out["probe"] = {pair: probe.result(timeout=60) for pair, probe in probes.items()}
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            self.error = e
        finally:
            self.cluster.heal()
            self.out["healed_at"] = time.monotonic()


def _pairs():
    return [(a, b) for a in netns_cluster.NODES for b in netns_cluster.NODES if a != b]


def _run(cluster, case: str, cut, noticed, watch: int, roles, index, conf, tmp_path, seconds: float = CUT):
    partition = Partition(cluster, index, cut, noticed, watch, seconds)
    partition.start()
    options = CheckOptions(processes=3, seconds=LEAD + seconds + SETTLE, faults=(), ttl=TTL, seed=29)
    try:
        result = run_check(
            conf, options, progress=lambda state: partition.started.set(), history=str(tmp_path / "history.json")
        )
    finally:
        partition.started.set()  # a run that failed to start must not leave the thread waiting
        partition.join(timeout=START_TIMEOUT + LEAD + seconds + 60)
        cluster.heal()
    assert not partition.is_alive(), "the partition thread did not end"
    if partition.error:
        raise partition.error
    out = partition.out
    events = result.events
    start = next(e["t"] for e in events if e["type"] == "start")
    stop = next(e["t"] for e in events if e["type"] == "stop")
    cut_at, healed_at = out["cut_at"], out["healed_at"]
    grants = [e["t"] for e in events if e["type"] == "ok" and e["process"] != "reaper"]
    summary = result.summary
    outcomes = dict(summary["outcomes"])
    errors = {name: n for name, n in outcomes.items() if name != "granted"}
    record = {
        "case": case,
        "roles": {name: f"n{i}" for name, i in roles.items()},
        "grants": summary["grants"],
        "grants_before_cut": sum(start <= t < cut_at for t in grants),
        "grants_during_cut": sum(cut_at <= t < healed_at for t in grants),
        "grants_after_heal": sum(t >= healed_at for t in grants),
        "errors": errors,
        "locks_lost": summary["locks_lost"],
        "late_writes_fenced": summary["late_writes"],
        "leftovers": summary["leftovers"],
        "noticed_after_s": out.get("noticed_after"),
        "violations": len(result.violations),
        "probe": out["probe"],
    }
    print(f"\npartition {case}: {record}")
    print(result.report())
    for at, views, shards in out["samples"]:
        seen = {
            f"n{i}": (v.get("master"), len(v.get("nodes", ()))) if "error" not in v else "?" for i, v in views.items()
        }
        print(f"  +{at:5.1f}s  (master, nodes) seen by each: {seen}  copies: {shards}")
    assert result.ok, result.report()
    assert start < cut_at and healed_at < stop, "the cut lay inside the workload"
    assert record["grants_before_cut"] >= 1 and record["grants_after_heal"] >= 1, record
    assert summary["leftovers"] == 0
    assert out.get("noticed_after") is not None, f"the cluster never showed the cut: {out['samples'][-3:]}"
    return record, out


def _config(cluster: netns_cluster.NetnsCluster) -> dict:
    index = f"test-partition-{uuid.uuid4().hex[:10]}"
    return {"BACKEND": ES_BACKEND, "OPTIONS": {"hosts": cluster.urls, "index": index}, "TTL": TTL}


def _prepared(cluster: netns_cluster.NetnsCluster) -> tuple[dict, str, dict[str, int]]:
    conf = _config(cluster)
    backend = load_backend(conf)
    try:
        backend.setup()  # made before the roles are read: the primary must be known before the cut
        index = backend.index
    finally:
        backend.close()
    return conf, index, _roles(cluster, index)


def _isolated(alone: int):
    """``noticed``: the isolated node has no master, the other two agree on a master of theirs and count 2 nodes."""
    others = [i for i in netns_cluster.NODES if i != alone]

    def noticed(views, shards) -> bool:
        majority = [views[i] for i in others]
        return (
            views[alone].get("master") is None
            and "error" not in views[alone]
            and all(v.get("master") not in (None, f"n{alone}") and len(v.get("nodes", ())) == 2 for v in majority)
        )

    return noticed


def test_the_primarys_node_isolated(whole, tmp_path):
    """The node of the lock index's primary (not the master) cut from both others: a replica is promoted."""
    conf, index, roles = _prepared(whole)
    primary = roles["primary"]
    cut = lambda: whole.isolate(primary)  # noqa: E731
    _, out = _run(whole, "primary isolated", cut, _isolated(primary), roles["master"], roles, index, conf, tmp_path)
    assert not any(ok for pair, ok in out["probe"].items() if f"n{primary}" in pair)
    assert all(ok for pair, ok in out["probe"].items() if f"n{primary}" not in pair)
    whole.wait_for_nodes(3, status="green", index=index, timeout=90)
    assert whole.primary(index) != primary, "a replica on the majority side became the primary"


def test_the_master_isolated(whole, tmp_path):
    """The elected master (not the primary's node) cut from both others: the two elect a new master."""
    conf, index, roles = _prepared(whole)
    master = roles["master"]
    cut = lambda: whole.isolate(master)  # noqa: E731
    # The others notice in 5-12 s and elect one of them first: the cut lasts as long as the bridge's (a busy CI
    # machine's new master still counted the old one 11 s into a 14 s cut).
    _run(whole, "master isolated", cut, _isolated(master), roles["third"], roles, index, conf, tmp_path, BRIDGE_CUT)
    whole.wait_for_nodes(3, timeout=90)
    assert whole.master() != master, "the majority elected another master"


def test_a_non_transitive_bridge(whole, tmp_path):
    """A (the primary's node) and C (the third) cut from each other, both seeing B (the master): A sees B, B sees C,
    A does not see C. The master sees everyone, so no node is removed; the primary's replication to C is what
    stalls, until TCP gives up on it and the primary fails C's copy through the master."""
    conf, index, roles = _prepared(whole)
    a, b, c = roles["primary"], roles["master"], roles["third"]

    def noticed(views, copies) -> bool:  # the master failed C's copy (none STARTED on C), yet no node was removed
        return (
            bool(copies)
            and copies[0][0] != "error"
            and not any(node == f"n{c}" and state == "STARTED" for node, _, state in copies)
            and all(len(v.get("nodes", ())) == 3 for v in views.values())
        )

    cut = lambda: whole.cut(a, c)  # noqa: E731
    _, out = _run(whole, "non-transitive bridge", cut, noticed, b, roles, index, conf, tmp_path, seconds=BRIDGE_CUT)
    probe = out["probe"]
    assert not probe[f"n{a}->n{c}"] and not probe[f"n{c}->n{a}"]
    assert probe[f"n{a}->n{b}"] and probe[f"n{b}->n{c}"] and probe[f"n{b}->n{a}"] and probe[f"n{c}->n{b}"]


def test_a_split_brain_of_a_node_bootstrapped_alone_is_caught(partitioned, tmp_path):
    """The unsafe variant: the primary's node cut off, then restarted as a cluster of its own (data wiped,
    ``cluster.initial_master_nodes`` naming it alone). Two clusters answer: a client of each takes the same lock,
    and the checker reports the overlap. Nothing in the lock's settings can prevent it; Elasticsearch 7's voting
    configuration does, unless an operator bootstraps a second cluster.

    Last in the module: the cluster stays split (two cluster UUIDs), the module's finalizer removes it.
    """
    conf = {**_config(partitioned), "TTL": 10.0}  # a lease no busy moment of the two clusters can end
    backend = load_backend(conf)
    try:
        backend.setup()
        index = backend.index
    finally:
        backend.close()
    roles = _roles(partitioned, index)
    alone = roles["primary"]
    partitioned.isolate(alone)
    others = [i for i in netns_cluster.NODES if i != alone]
    deadline = time.monotonic() + 60
    while not all(partitioned.local_view(i).get("nodes") == [f"n{o}" for o in others] for i in others):
        assert time.monotonic() < deadline, "the majority did not drop the cut-off node"
        time.sleep(0.5)
    partitioned.bootstrap_alone(alone)
    sides = {"alone": [alone], "majority": others}
    configs = {
        side: {**conf, "OPTIONS": {**conf["OPTIONS"], "hosts": [partitioned.nodes[i].url for i in nodes]}}
        for side, nodes in sides.items()
    }
    paths = {side: str(tmp_path / f"{side}.jsonl") for side in sides}
    run_processes(take_and_hold, [(configs[side], "split", paths[side]) for side in sides], timeout=120)
    violations = check_history(read_events(paths.values()))
    print(f"\nsplit brain (n{alone} bootstrapped alone): {[v.message for v in violations]}")
    assert "a" in {v.check for v in violations}, [v.as_dict() for v in violations]
