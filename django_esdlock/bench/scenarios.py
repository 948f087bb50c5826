"""The figures of a run, the same for every store: each returns its figures next to their baselines."""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..exceptions import LockTimeout
from ..locks import global_lock, lock_tree, semaphore
from ..reaper import Reaper
from .common import (
    Figure,
    Goal,
    interleaved_rates,
    percentile,
    ratio_at_least,
    ratio_at_most,
    tree_path,
    value_at_most,
)
from .kit import StoreKit
from .peers import PeerSpec, peer_lock, unavailable
from .workers import WorkerPool

Say = Callable[[str], None]

NAMESPACE = "bench"
CONSTANT = Goal("ratio", True, 1.0, "= depth 1")
WAKE_PATH = "/wakeup"
WAKE_WARMUP_ROUNDS = 3
HOT_PATHS = [f"/hot/sub/dir/leaf{k}" for k in range(4)]
"""Contention: four leaves of one subtree (depth 4), so workers both share ancestors and collide on leaves."""
OWN_LEAF_PARENT = "/hot/sub/dir"
"""The parent of the contention figure's leaves: its processes share the ancestors of ``HOT_PATHS``."""
CHURN_PATHS = [f"/a/{k}/leaf" for k in range(16)]
CHURN_HOLD = 0.01
WRITER_ROUNDS = 3
DEADLOCK_PATHS = ("/deadlock/a", "/deadlock/b")


def _timed(operation: Callable[[], Any]) -> float:
    started = time.perf_counter()
    operation()
    return time.perf_counter() - started


def _lock_pair(path: str, backend: Any) -> Callable[[], None]:
    def pair() -> None:
        with lock_tree(path, namespace=NAMESPACE, backend=backend):
            pass

    return pair


def pairs(kit: StoreKit, depths: Sequence[int], seconds: float, say: Say) -> list[Figure]:
    """Tree lock acquire+release pairs/s by depth, against each of the store's baseline pairs."""
    figures = []
    for depth in depths:
        say(f"{kit.name}: pairs/s at depth {depth}")
        baselines = kit.baselines(depth)
        operations = {"lock": _lock_pair(tree_path(depth), kit.backend), **{b.key: b.run for b in baselines}}
        rates = interleaved_rates(operations, seconds)
        lock = rates["lock"]
        for baseline in baselines:
            figures.append(
                Figure(
                    key=f"{kit.name}.pair.d{depth}.vs_{baseline.key}",
                    backend=kit.name,
                    label=f"tree lock pairs/s, depth {depth}",
                    value=lock.per_second,
                    unit="/s",
                    baseline_label=baseline.label,
                    baseline=rates[baseline.key].per_second,
                    goal=baseline.goal,
                    extra={
                        "pairs": lock.count,
                        "median_pair_s": lock.median,
                        "baseline_pairs": rates[baseline.key].count,
                        "baseline_median_pair_s": rates[baseline.key].median,
                    },
                )
            )
    return figures


def requests(kit: StoreKit, depths: Sequence[int], rounds: int, say: Say) -> list[Figure]:
    """Requests (round trips) one uncontended acquire sends, by depth, against depth 1: must be constant."""
    say(f"{kit.name}: {kit.request_word} per acquire")
    unit = "req" if kit.request_word == "requests" else "rt"
    counts: dict[int, tuple[float, float]] = {}
    for depth in sorted({1, *depths}):
        _lock_pair(tree_path(depth), kit.backend)()  # warm: index check, connection setup
        acquired = released = 0
        for _ in range(rounds):
            lock = lock_tree(tree_path(depth), namespace=NAMESPACE, backend=kit.backend)
            with kit.counting() as count:
                lock.acquire()
            acquired += count.value
            with kit.counting() as count:
                lock.release()
            released += count.value
        counts[depth] = (acquired / rounds, released / rounds)
    return [
        Figure(
            key=f"{kit.name}.requests.d{depth}",
            backend=kit.name,
            label=f"{kit.request_word} per acquire, depth {depth}",
            value=counts[depth][0],
            unit=unit,
            baseline_label=f"{kit.request_word} per acquire, depth 1",
            baseline=counts[1][0],
            goal=CONSTANT,
            extra={"per_release": counts[depth][1]},
        )
        for depth in depths
    ]


def wakeup(kit: StoreKit, pool: WorkerPool, rounds: int, idle_floor: float | None, say: Say) -> list[Figure]:
    """Release in this process → grant in a blocked waiter process, p50 and p99, against one uncontended pair.

    The latency runs from just before this process's ``release()`` to the
    return of the waiter's ``acquire()``, so its floor is one release plus
    one acquire: an uncontended pair. The p50 is also held against
    ``idle_floor``, the time an idle process of this machine takes to see a
    message at all (every wake-up pays it).
    """
    say(f"{kit.name}: wake-up latency, {rounds} rounds")
    pair = _lock_pair(WAKE_PATH, kit.backend)
    pair()
    floor = statistics.median(_timed(pair) for _ in range(max(20, rounds)))
    (conn,) = pool.start("wake", kit.config, 1, path=WAKE_PATH, namespace=NAMESPACE)
    latencies = []
    try:
        for round_ in range(WAKE_WARMUP_ROUNDS + rounds):
            lock = lock_tree(WAKE_PATH, namespace=NAMESPACE, backend=kit.backend).acquire()
            try:
                conn.send("go")
                if pool.receive(conn) != "waiting":
                    raise RuntimeError("the waiter did not start waiting")
                time.sleep(random.uniform(0.02, 0.08))  # the waiter is asleep in wait() by now
                released = time.monotonic()
            finally:
                lock.release()  # whatever failed, the waiter must not block for ever
            granted = pool.receive(conn)
            if round_ >= WAKE_WARMUP_ROUNDS:
                latencies.append(granted - released)
    finally:
        conn.send("stop")
    pool.results([conn])
    postgres = kit.name == "postgres"
    goal = value_at_most(0.005, "≤ 5 ms") if postgres else ratio_at_most(1.0) if kit.name == "elasticsearch" else None
    common = {"backend": kit.name, "unit": "s", "baseline_label": "one uncontended pair", "baseline": floor}
    against_idle = []
    if idle_floor:
        against_idle.append(
            Figure(
                key=f"{kit.name}.wakeup.p50_vs_idle",
                backend=kit.name,
                label="wake-up after release, p50",
                value=percentile(latencies, 0.5),
                unit="s",
                baseline_label="an idle process sees a message",
                baseline=idle_floor,
                goal=ratio_at_most(3.0) if postgres else None,
            )
        )
    return [
        *against_idle,
        Figure(
            key=f"{kit.name}.wakeup.p50",
            label="wake-up after release, p50",
            value=percentile(latencies, 0.5),
            goal=goal,
            extra={"rounds": len(latencies)},
            **common,
        ),
        Figure(
            key=f"{kit.name}.wakeup.p99",
            label="wake-up after release, p99",
            value=percentile(latencies, 0.99),
            **common,
        ),
    ]


def _contend(kit: StoreKit, pool: WorkerPool, workers: int, seconds: float) -> tuple[float, list[float]]:
    stop_at = time.monotonic() + seconds
    results = pool.run("contend", kit.config, workers, paths=HOT_PATHS, namespace=NAMESPACE, stop_at=stop_at)
    began = min(r["began"] for r in results)
    waits = [w for r in results for w in r["waits"]]
    return sum(r["pairs"] for r in results) / (stop_at - began), waits


def _contend_own_leaves(kit: StoreKit, pool: WorkerPool, workers: int, seconds: float) -> float:
    stop_at = time.monotonic() + seconds
    each = [
        {"paths": [f"{OWN_LEAF_PARENT}/own{k}"], "namespace": NAMESPACE, "stop_at": stop_at} for k in range(workers)
    ]
    results = pool.run_each("contend", kit.config, each)
    began = min(r["began"] for r in results)
    return sum(r["pairs"] for r in results) / (stop_at - began)


def contention(kit: StoreKit, pool: WorkerPool, workers: int, seconds: float, say: Say) -> list[Figure]:
    """``workers`` processes hammering four leaves of one subtree: pairs/s against one process, longest wait.

    The longest wait is held against a fair turn: the time for every worker
    to get the lock once at the measured rate (workers / pairs/s). A third
    figure gives each process a leaf of its own under the same subtree: what
    sharing the ancestors costs without a wait on a leaf.
    """
    say(f"{kit.name}: {workers} processes on one subtree")
    solo_rate, _ = _contend(kit, pool, 1, seconds)
    rate, waits = _contend(kit, pool, workers, seconds)
    own_rate = _contend_own_leaves(kit, pool, workers, seconds)
    return [
        Figure(
            key=f"{kit.name}.contention.own_leaves",
            backend=kit.name,
            label=f"{workers} processes, a leaf each under one subtree, pairs/s",
            value=own_rate,
            unit="/s",
            baseline_label="1 process, same subtree",
            baseline=solo_rate,
        ),
        Figure(
            key=f"{kit.name}.contention.pairs",
            backend=kit.name,
            label=f"{workers} processes on one subtree, pairs/s",
            value=rate,
            unit="/s",
            baseline_label="1 process, same subtree",
            baseline=solo_rate,
            goal={"postgres": ratio_at_least(1.0), "elasticsearch": ratio_at_least(0.9)}.get(kit.name),
        ),
        Figure(
            key=f"{kit.name}.contention.longest_wait",
            backend=kit.name,
            label=f"{workers} processes on one subtree, longest wait",
            value=max(waits, default=float("nan")),
            unit="s",
            baseline_label=f"fair turn ({workers} / pairs/s)",
            baseline=workers / rate if rate else float("nan"),
            goal=ratio_at_most(2.0) if kit.name == "postgres" else None,
            extra={"p50_wait": percentile(waits, 0.5), "p99_wait": percentile(waits, 0.99), "waits": len(waits)},
        ),
    ]


def writer_wait(kit: StoreKit, pool: WorkerPool, churners: int, seconds: float, say: Say) -> list[Figure]:
    """One X request on ``/a`` while ``churners`` processes keep taking X on leaves below it, against the longest hold.

    The writer tries :data:`WRITER_ROUNDS` times (each given at most
    ``max(1, 5 * seconds)`` s) and the figure is its longest wait; a request
    that times out counts as waiting the whole time, and ends the rounds.
    """
    say(f"{kit.name}: writer wait on /a, {churners} processes below")
    give_up = max(1.0, 5 * seconds)
    conns = pool.start("churn", kit.config, churners, paths=CHURN_PATHS, namespace=NAMESPACE, hold=CHURN_HOLD)
    waits, starved = [], False
    try:
        for conn in conns:
            if pool.receive(conn) != "started":
                raise RuntimeError("a churning worker did not start")
        time.sleep(0.2)  # every worker in its stride
        for _ in range(WRITER_ROUNDS):
            lock = lock_tree("/a", timeout=give_up, namespace=NAMESPACE, backend=kit.backend)
            started = time.perf_counter()
            try:
                lock.acquire()
            except LockTimeout:
                starved = True
            waits.append(time.perf_counter() - started)
            if starved:
                break
            lock.release()
    finally:
        for conn in conns:
            conn.send("stop")
    results = pool.results(conns)
    longest_hold = max(r["longest_hold"] for r in results)
    note = f"starved: no grant within {give_up:g} s; the value is the time it gave up after" if starved else ""
    return [
        Figure(
            key=f"{kit.name}.writer_wait",
            backend=kit.name,
            label=f"writer wait for X on /a, {churners} processes below",
            value=max(waits),
            unit="s",
            baseline_label="longest hold below /a",
            baseline=longest_hold,
            goal=ratio_at_most(2.0),
            note=note,
            extra={
                "waits": waits,
                "starved": starved,
                "churn_pairs": sum(r["pairs"] for r in results),
                "p50_hold": percentile([h for r in results for h in r["holds"]], 0.5),
            },
        )
    ]


def deadlock_latency(kit: StoreKit, pool: WorkerPool, rounds: int, deadlock_timeout: float, say: Say) -> list[Figure]:
    """Two processes each hold one path and ask for the other's: cycle closed → victim's ``LockDeadlock``, p50, p99.

    Each round, worker 1 takes X on ``/deadlock/a`` and worker 2 on
    ``/deadlock/b``; then both ask for the other path at once (in a random
    order). The latency runs from the later of the two ``acquire()`` calls
    (the request that closes the cycle) to the return of the victim's
    ``LockDeadlock``, and is held against ``deadlock_timeout``: a request
    waits that long before it looks, so the ratio is at least 1 and what
    is above 1 is the looking (two reads) and the polling. A round with no
    victim or two is counted apart, not measured.
    """
    say(f"{kit.name}: deadlock detection latency, {rounds} rounds, deadlock timeout {deadlock_timeout:g} s")
    give_up = 10 * deadlock_timeout + 10  # a request that is never picked ends the figure, not the run
    conns = pool.start(
        "deadlock", kit.config, 2, namespace=NAMESPACE, deadlock_timeout=deadlock_timeout, timeout=give_up
    )
    latencies, survivor_after, odd = [], [], 0
    a, b = DEADLOCK_PATHS
    try:
        for _ in range(rounds):
            for conn, (first, second) in zip(conns, ((a, b), (b, a)), strict=True):
                conn.send(("go", first, second))
            for conn in conns:
                if pool.receive(conn) != "held":
                    raise RuntimeError("a deadlock worker did not take its first path")
            for conn in random.sample(conns, len(conns)):
                conn.send("close")
            outcomes = [pool.receive(conn, timeout=2 * give_up) for conn in conns]
            closed = max(started for _, started, _ in outcomes)
            victims = [ended for outcome, _, ended in outcomes if outcome == "deadlock"]
            granted = [ended for outcome, _, ended in outcomes if outcome == "granted"]
            if len(victims) != 1:
                odd += 1
                continue
            latencies.append(victims[0] - closed)
            survivor_after.append(granted[0] - victims[0])
    finally:
        for conn in conns:
            conn.send("stop")
    pool.results(conns)
    common = {
        "backend": kit.name,
        "unit": "s",
        "baseline_label": "deadlock timeout",
        "baseline": deadlock_timeout,
        "note": f"{odd} of {rounds} rounds without exactly one victim" if odd else "",
    }
    return [
        Figure(
            key=f"{kit.name}.deadlock.p50",
            label="deadlock detection latency, p50",
            value=percentile(latencies, 0.5),
            extra={
                "rounds": len(latencies),
                "without_one_victim": odd,
                "p50_survivor_granted_after_victim_s": percentile(survivor_after, 0.5),
            },
            **common,
        ),
        Figure(
            key=f"{kit.name}.deadlock.p99",
            label="deadlock detection latency, p99",
            value=percentile(latencies, 0.99),
            goal=ratio_at_most(2.0),
            **common,
        ),
    ]


def reaping(kit: StoreKit, count: int, say: Say) -> list[Figure]:
    """``Reaper(backend).run()`` over ``count`` expired holders, against deleting them raw by id.

    The per-holder INFO log lines of the reaper are muted while it runs: the
    figure is the store work, not the terminal's.
    """
    say(f"{kit.name}: reaping {count:,} expired holders")
    namespace = "bench-reap"
    kit.fill(namespace, count, expired=True)
    logger = logging.getLogger("django_esdlock")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        started = time.perf_counter()
        report = Reaper(kit.backend, namespace=namespace).run()
        elapsed = time.perf_counter() - started
    finally:
        logger.setLevel(level)
    kit.fill(namespace, count, expired=True)
    floor = _timed(lambda: kit.delete_raw(namespace, count))
    evicted = len(report.evicted)
    return [
        Figure(
            key=f"{kit.name}.reap",
            backend=kit.name,
            label=f"reap {count:,} expired holders",
            value=elapsed,
            unit="s",
            baseline_label="raw bulk delete of them",
            baseline=floor,
            goal=value_at_most(5.0, "< 5 s") if count >= 10_000 else None,
            note="" if evicted == count else f"the reaper removed {evicted:,} of {count:,}",
            extra={"evicted": evicted},
        )
    ]


def _rate(results: list[dict[str, Any]]) -> float:
    began = min(r["began"] for r in results)
    return sum(r["pairs"] for r in results) / (results[0]["stop_at"] - began)


def global_locks(
    kit: StoreKit, pool: WorkerPool, workers: int, seconds: float, peers: Sequence[PeerSpec], say: Say
) -> list[Figure]:
    """``global_lock()`` pairs/s: one process against the store's cheapest durable pair, and ``workers``
    processes contending for it against one process alone and against each peer lock in the same run.
    """
    say(f"{kit.name}: global_lock, 1 and {workers} processes")
    postgres = kit.name == "postgres"
    row = kit.baselines(1)[0]

    def ours() -> None:
        with global_lock("bench-pair", backend=kit.backend):
            pass

    rates = interleaved_rates({"lock": ours, row.key: row.run}, seconds)
    figures = [
        Figure(
            key=f"{kit.name}.global.pair.vs_{row.key}",
            backend=kit.name,
            label="global_lock pairs/s, 1 process",
            value=rates["lock"].per_second,
            unit="/s",
            baseline_label=row.label,
            baseline=rates[row.key].per_second,
            goal=ratio_at_least(0.9) if postgres else None,
        )
    ]
    contended: dict[int, float] = {}
    waits: list[float] = []
    for count in (1, workers):
        results = pool.run_together("contend_global", kit.config, count, seconds)
        contended[count] = _rate(results)
        waits = [w for r in results for w in r["waits"]]
    figures.append(
        Figure(
            key=f"{kit.name}.global.contention",
            backend=kit.name,
            label=f"{workers} processes on one global_lock, pairs/s",
            value=contended[workers],
            unit="/s",
            baseline_label="1 process alone",
            baseline=contended[1],
            goal=ratio_at_least(0.5) if postgres else None,
            extra={"longest_wait": max(waits, default=math.nan), "p50_wait": percentile(waits, 0.5)},
        )
    )
    for peer in peers:
        reason = unavailable(peer)
        if reason is not None:
            say(f"peer {peer.label}: skipped, {reason}")
            figures.append(_skipped(kit, peer, reason))
            continue
        say(f"peer {peer.label}: 1 and {workers} processes")
        with peer_lock(peer) as (acquire, release):

            def peer_pair(acquire: Any = acquire, release: Any = release) -> None:
                acquire()
                release()

            solo = interleaved_rates({"lock": ours, "peer": peer_pair}, seconds)
        results = pool.run_together("contend_peer", kit.config, workers, seconds, peer=dataclasses.asdict(peer))
        figures += [
            Figure(
                key=f"{kit.name}.peer.{peer.key}.pair",
                backend=kit.name,
                label="global_lock pairs/s, 1 process",
                value=solo["lock"].per_second,
                unit="/s",
                baseline_label=f"{peer.label}, 1 process",
                baseline=solo["peer"].per_second,
            ),
            Figure(
                key=f"{kit.name}.peer.{peer.key}.contention",
                backend=kit.name,
                label=f"{workers} processes on one global_lock, pairs/s",
                value=contended[workers],
                unit="/s",
                baseline_label=f"{peer.label}, {workers} processes",
                baseline=_rate(results),
                goal=ratio_at_least(1.0) if postgres and peer.key == "tooz_pg" else None,
            ),
        ]
    return figures


SEMAPHORE_LIMIT = 3
SEMAPHORE_HOLD = 0.005
"""Seconds each contending holder keeps its slot: work that a semaphore lets run side by side."""


def _most_at_once(holds: list[tuple[float, float]]) -> int:
    """The most holds that overlap at one instant, from (grant, release) times on one clock."""
    edges = sorted([(start, 1) for start, _ in holds] + [(end, -1) for _, end in holds])
    at_once = most = 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    return most


def semaphores(kit: StoreKit, pool: WorkerPool, workers: int, seconds: float, say: Say) -> list[Figure]:
    """A semaphore's pairs/s against a mutex's (``global_lock``), one process; ``workers`` processes holding
    a slot of a semaphore of limit 3 for 5 ms each against as many on a mutex, with the most holders seen at once.
    """
    say(f"{kit.name}: semaphore pairs, 1 and {workers} processes")

    def semaphore_pair() -> None:
        with semaphore("bench-pair", SEMAPHORE_LIMIT, namespace=NAMESPACE, backend=kit.backend):
            pass

    def mutex_pair() -> None:
        with global_lock("bench-mutex-pair", backend=kit.backend):
            pass

    rates = interleaved_rates({"semaphore": semaphore_pair, "mutex": mutex_pair}, seconds)
    slot = {"name": "bench-shared", "limit": SEMAPHORE_LIMIT, "hold": SEMAPHORE_HOLD}
    shared = pool.run_together("contend_semaphore", kit.config, workers, seconds, **slot)
    mutex = pool.run_together("contend_global", kit.config, workers, seconds, hold=SEMAPHORE_HOLD)
    holds = [hold for r in shared for hold in r["holds"] if hold[1]]
    waits = [w for r in shared for w in r["waits"]]
    return [
        Figure(
            key=f"{kit.name}.semaphore.pair.vs_mutex",
            backend=kit.name,
            label=f"semaphore (limit {SEMAPHORE_LIMIT}) pairs/s, 1 process",
            value=rates["semaphore"].per_second,
            unit="/s",
            baseline_label="global_lock pairs/s",
            baseline=rates["mutex"].per_second,
            goal=ratio_at_least(0.9),
            extra={"median_pair_s": rates["semaphore"].median, "baseline_median_pair_s": rates["mutex"].median},
        ),
        Figure(
            key=f"{kit.name}.semaphore.contention",
            backend=kit.name,
            label=f"{workers} processes on a semaphore of limit {SEMAPHORE_LIMIT}, 5 ms holds, pairs/s",
            value=_rate(shared),
            unit="/s",
            baseline_label=f"{workers} processes on one global_lock, 5 ms holds",
            baseline=_rate(mutex),
            extra={
                "most_at_once": _most_at_once(holds),
                "longest_wait": max(waits, default=math.nan),
                "p50_wait": percentile(waits, 0.5),
            },
        ),
    ]


def _skipped(kit: StoreKit, peer: PeerSpec, reason: str) -> Figure:
    return Figure(
        key=f"{kit.name}.peer.{peer.key}.skipped",
        backend=kit.name,
        label=f"peer {peer.label}",
        value=math.nan,
        unit="/s",
        baseline_label="skipped",
        baseline=math.nan,
        note=f"skipped: {reason}",
    )
