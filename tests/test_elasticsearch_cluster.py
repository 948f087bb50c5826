"""Failover on the genuine three-node Elasticsearch cluster: nodes SIGKILLed under real lock traffic.

Skipped unless ELASTICSEARCH_HOSTS names the cluster of ../shared/elasticsearch/start-cluster
(./runtests starts it in the background and sets it).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from django_esdlock.backends.elasticsearch.answers import TOKEN_TERM_SHIFT
from django_esdlock.checker.failover import start_cluster_restart
from django_esdlock.conf import load_backend
from django_esdlock.exceptions import LockBackendUnavailable, LockLost, LockUnavailable

from . import cluster
from .peer import SPAWN, setup_django
from .procs import spawned

pytest_plugins = ["django_esdlock.testing"]

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.alone,  # nodes killed and restarted: no other test's load beside them
    pytest.mark.skipif(not cluster.hosts(), reason="no ELASTICSEARCH_HOSTS (the three-node cluster)"),
]


@pytest.fixture(scope="module")
def whole_cluster():
    """The cluster with its three nodes up, before and after each test (nodes killed are started again)."""
    cluster.wait_for(3, timeout=240)  # ./runtests started it in the background
    yield
    cluster.make_whole()


@pytest.fixture
def config(whole_cluster):
    with cluster.lock_configs() as make:
        yield make


def _counter_worker(config, until, state, lock_guard, log) -> dict:
    """Increment a counter under lock_tree("/counter") until ``until.value`` (time.time()); report what happened.

    ``state``: [counter, holders inside, last token, overlaps, tokens not
    larger than the previous grant's]; ``log`` gets (time, token) per grant.
    """
    setup_django()
    from django_esdlock import lock_tree
    from django_esdlock.exceptions import LockBackendUnavailable, LockLost

    backend = load_backend(config)
    seen = {"grants": 0, "lost": 0, "expired": 0, "store_errors": 0}
    while time.time() < until.value:
        told = False
        try:
            with lock_tree("/counter", namespace="failover", timeout=30, backend=backend) as lock:
                with lock_guard:
                    state[1] += 1
                    if state[1] > 1:
                        state[3] += 1  # two holders inside at once
                    if lock.token <= state[2]:
                        state[4] += 1  # a token not larger than the previous grant's
                    state[2] = max(state[2], lock.token)
                    value = state[0]
                    log.append((time.time(), lock.token))
                time.sleep(0.003)  # the window a lost update needs
                with lock_guard:
                    state[0] = value + 1
                    state[1] -= 1
                seen["grants"] += 1
                told = lock.lost  # the renewer already said so: renewals failed for a lease
        except LockLost:
            # Told by the renewer before the release (the cluster took writes from nobody for a
            # lease: the lock expired, and its holder knew), or only at the release: the grant
            # was gone although every renewal had been acknowledged — a vanished grant.
            seen["expired" if told else "lost"] += 1
        except LockBackendUnavailable:  # includes LockStoreBusy: no grant, nothing written
            seen["store_errors"] += 1
            time.sleep(0.2)
    backend.close()
    return seen


def test_counter_survives_killing_the_primary_then_the_master(config):
    """4 processes, SIGKILL of the lock index's primary node, restart, SIGKILL of the master: no violation."""
    conf = config(ttl=6)
    backend = load_backend(conf)
    backend.setup()
    index = backend.index
    cluster.wait_for(3, status="green", index=index, timeout=30)
    manager = SPAWN.Manager()
    try:
        state, log, guard = manager.list([0, 0, 0, 0, 0]), manager.list(), manager.Lock()
        results = _run_with_faults(conf, index, backend, state, guard, log, manager.Value("d", time.time() + 150))
    finally:
        backend.close()
        manager.shutdown()
    grants = sum(r["grants"] for r in results["workers"])
    lost = sum(r["lost"] for r in results["workers"])
    print(f"failover: {results}")
    assert grants >= 40
    assert results["counter"] == grants, "lost updates"
    assert results["overlaps"] == 0
    assert results["stale_tokens"] == 0
    # A LockLost at a release right across the failover is possible and safe (the counter and the
    # overlap check above hold): the new primary may re-execute a release the old one had already
    # applied and replicated, and the replay finds the holder gone. Where the node outlived the
    # release, its tombstone tells the replay apart (test_elasticsearch_replayed_release.py); where
    # that release deleted the node (its last holder and marker gone), nothing is left to tell a
    # replay from a vanished grant, and the release reports LockLost. It must stay rare.
    assert lost <= 2, f"{lost} releases found their grant gone"
    # Fencing tokens across the primary change: proven by the grants made before and after it.
    assert results["term_after"] > results["term_before"]
    assert results["first_token_after"] > results["last_token_before"]
    # The term is the token's high part; below it, the promoted replica continued the sequence.
    sequence = (1 << TOKEN_TERM_SHIFT) - 1
    assert results["first_token_after"] >> TOKEN_TERM_SHIFT == results["term_after"]
    assert results["first_token_after"] & sequence > results["last_token_before"] & sequence
    assert results["held_kept"]


def _run_with_faults(conf, index, backend, state, guard, log, until) -> dict:
    from django_esdlock import lock_tree

    workers_args = [(conf, until, state, guard, log) for _ in range(4)]
    out: dict = {}
    # Its lease outlasts the seconds a loaded 2-core machine takes to promote a replica (writes wait meanwhile).
    held = lock_tree("/held", namespace="failover", ttl=10, timeout=10, backend=backend)
    with spawned(_counter_worker, workers_args) as workers:
        _wait_for_grants(log, 15, workers)
        held.acquire()  # kept by the test process across the primary change
        primary = cluster.primary_node(index)
        out["term_before"] = cluster.primary_term(index)
        out["last_token_before"] = max(t for _, t in log)
        killed_at = time.time()
        cluster.kill(primary)
        process = cluster.restart(primary)
        # The promoted replica takes writes: grants go on while the dead node restarts.
        _wait_for_grants(log, 10, workers, after=killed_at)
        out["term_after"] = cluster.primary_term(index)
        out["first_token_after"] = min(t for at, t in log if at > killed_at + 0.5)
        competitor = lock_tree("/held", namespace="failover", timeout=0, backend=load_backend(conf))
        with ThreadPoolExecutor(1) as other_thread, pytest.raises(LockUnavailable):
            other_thread.submit(competitor.acquire).result(timeout=30)
        cluster.finish(process)
        cluster.wait_for(3, status="green", index=index, timeout=60)
        out["held_kept"] = not held.lost
        held.release()  # raises LockLost had its grant vanished
        master = cluster.master_node()
        killed_at = time.time()
        cluster.kill(master)
        _wait_for_grants(log, 10, workers, after=killed_at)
        until.value = time.time() + 2
        results = workers.results(timeout=60)
    out["workers"] = results
    out["counter"], _, _, out["overlaps"], out["stale_tokens"] = list(state)
    out["grants_logged"] = len(log)
    return out


def _wait_for_grants(log, count: int, workers, *, after: float = 0.0, timeout: float = 45.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(1 for at, _ in list(log) if at > after) < count:
        workers.check()
        assert time.monotonic() < deadline, f"fewer than {count} grants within {timeout:g}s"
        time.sleep(0.2)


def test_primary_only_acknowledgement_can_lose_a_grant(config):
    """No replica (wait_for_active_shards 1): a grant acknowledged by its primary alone, and the primary's node lost.

    While the node is down nothing is granted (the index is red: LockStoreBusy)
    and the holder is told its lock is lost once renewals failed for a lease.
    If the node's data is gone for good and an operator accepts the loss
    (``allocate_empty_primary``), the acknowledged grant has vanished; the
    empty shard's sequence starts again, under a higher primary term, so
    fencing tokens still increase.
    """
    from django_esdlock import lock_tree

    conf = config(ttl=3, number_of_replicas=0, wait_for_active_shards=1)
    backend = load_backend(conf)
    try:
        lock = lock_tree("/file", namespace="durability", backend=backend).acquire()
        token = lock.token
        node = cluster.primary_node(backend.index)
        cluster.kill(node)
        other = load_backend(conf)
        competitor = lock_tree("/file", namespace="durability", timeout=0, backend=other)
        with ThreadPoolExecutor(1) as other_thread, pytest.raises(LockBackendUnavailable):
            other_thread.submit(competitor.acquire).result(timeout=30)  # the index is red: busy, not granted
        deadline = time.monotonic() + 15
        while not lock.lost and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lock.lost
        live = [i for i in cluster.NODES if i != node]
        cluster.request(
            "/_cluster/reroute",
            method="POST",
            body={
                "commands": [
                    {
                        "allocate_empty_primary": {
                            "index": cluster.concrete(backend.index),  # reroute names no alias
                            "shard": 0,
                            "node": f"n{live[0]}",
                            "accept_data_loss": True,
                        }
                    }
                ]
            },
            nodes=live,
        )
        cluster.wait_for(2, status="green", index=backend.index, timeout=30)
        with pytest.raises(LockLost):
            lock.release()  # the holder is told
        again = lock_tree("/file", namespace="durability", timeout=5, backend=other).acquire()
        assert again.token > token, "tokens keep increasing through an empty primary (a higher term)"
        assert again.token & ((1 << TOKEN_TERM_SHIFT) - 1) <= token & ((1 << TOKEN_TERM_SHIFT) - 1)  # sequence anew
        again.release()
        other.close()
    finally:
        backend.close()


def test_lock_check_is_clean_when_nodes_fail_over(config, lock_check):
    """lock_check in short mode with the failover fault (primary's node SIGKILLed, restarted), pauses and kills."""
    conf = config(ttl=3)
    result = lock_check(
        conf,
        seed=17,
        seconds=12,  # room for a failover, a pause past the lease and a kill, one after the other, on a busy machine
        faults=("failover", "pause", "kill"),
        failover_restart=start_cluster_restart(cluster.START),
    )
    print(result.report())
    assert result.ok, result.report()
    summary = result.summary
    assert summary["faults"]["failover"] >= 1 and summary["faults"]["pause"] >= 1 and summary["faults"]["kill"] >= 1
    assert summary["nodes_killed"][0].endswith("(primary)")
    assert summary["failover_problems"] == [], summary["failover_problems"]
    assert summary["grants"] >= 5 and summary["leftovers"] == 0
    assert any(e["type"] == "cluster_whole" for e in result.events)


def _check_warnings(conf) -> list[str]:
    """Run ``manage.py check --deploy --tag django_esdlock --fail-level WARNING`` with ``conf``; return the ids."""
    import io
    import re

    from django.core.management import call_command
    from django.core.management.base import SystemCheckError
    from django.test import override_settings

    with override_settings(LOCK_BACKEND=conf):
        try:
            call_command("check", deploy=True, tags=["django_esdlock"], fail_level="WARNING", stdout=io.StringIO())
        except SystemCheckError as e:
            return re.findall(r"\((django_esdlock\.[A-Z]\d+)\)", str(e))
    return []


def test_check_warns_about_a_lock_index_that_one_node_loss_would_empty(config):
    """W005 on the live cluster: not for the default (3 copies, a majority), yes once the index keeps one copy."""
    conf = config(ttl=5)
    backend = load_backend(conf)
    try:
        backend.setup()
        assert _check_warnings(conf) == []
        # An operator takes the replicas away: the live index's settings are what check judges.
        cluster.request(
            f"/{backend.index}/_settings",
            method="PUT",
            body={"index": {"auto_expand_replicas": False, "number_of_replicas": 0}},
        )
        assert _check_warnings(conf) == ["django_esdlock.W005"]
        # Created so from the start, by OPTIONS: the same warning.
        alone = config(ttl=5, number_of_replicas=0)
        other = load_backend(alone)
        other.setup()
        other.close()
        assert _check_warnings(alone) == ["django_esdlock.W005"]
    finally:
        backend.close()


def test_check_reads_every_nodes_clock_and_warns_only_past_the_margin(config):
    """W011 on the live cluster: its three nodes (one machine's clock) are within the margin; a margin below what
    the readings prove (0) is past, and the warning names the nodes."""
    backend = load_backend(config(ttl=5))
    try:
        clocks, round_trip = backend._node_clocks()
        assert len(clocks) == 3 and round_trip < 5, clocks
        assert backend._clock_warnings() == []
        backend.clock_skew_margin = -0.001  # no setting allows it: the only way to see the warning without a skew
        (warning,) = backend._clock_warnings()
        assert warning.id == "django_esdlock.W011" and "CLOCK_SKEW_MARGIN" in warning.msg
        assert any(f"node {name!r}" in warning.msg for name in clocks)
    finally:
        backend.close()
