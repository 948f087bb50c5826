"""The async figures: pairs/s of one task and of many tasks of one process, and the wake-up of a waiting task.

Only the public async API (``alock_tree``, ``AsyncLock``) is measured, on an
event loop of its own; the kit's backend closes its connections of that loop
after (``aclose()``).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..aio import alock_tree
from .common import Figure, Rate, percentile, ratio_at_least
from .kit import StoreKit
from .workers import WorkerPool

T = TypeVar("T")
Say = Callable[[str], None]

NAMESPACE = "bench-aio"
WAKE_PATH = "/aio-wakeup"
WAKE_WARMUP_ROUNDS = 3
MANY_GOAL_STORES = ("postgres", "elasticsearch")
"""Where many tasks must beat one by :data:`MANY_GOAL`: the stores with (or to have) native async I/O."""
MANY_GOAL = 5.0


def task_path(i: int) -> str:
    """The path of task ``i``: top-level and its own, so the tasks share no node (not even an ancestor)."""
    return f"/aio-task-{i}"


async def _pair(path: str, backend: Any) -> None:
    async with alock_tree(path, namespace=NAMESPACE, backend=backend):
        pass


async def _pairs_until(path: str, backend: Any, stop_at: float, rate: Rate) -> None:
    """Take and give back X on ``path`` until ``stop_at``, counting the pairs finished before it."""
    while (started := time.perf_counter()) < stop_at:
        await _pair(path, backend)
        finished = time.perf_counter()
        if finished <= stop_at:
            rate.count += 1
            rate.latencies.append(finished - started)


async def _tasks_rate(backend: Any, tasks: int, seconds: float) -> Rate:
    """Pairs/s of ``tasks`` tasks of this loop, each on its own path, running together for ``seconds``."""
    await asyncio.gather(*(_pair(task_path(i), backend) for i in range(tasks)))  # warm: nodes, connections
    rate = Rate()
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(_pairs_until(task_path(i), backend, stop_at, rate) for i in range(tasks)))
    rate.elapsed = stop_at - started
    return rate


def _run(kit: StoreKit, work: Awaitable[T]) -> T:
    async def main() -> T:
        try:
            return await work
        finally:
            await kit.backend.aclose()

    return asyncio.run(main())


def pairs(kit: StoreKit, tasks: int, seconds: float, say: Say) -> list[Figure]:
    """``alock_tree`` acquire+release pairs/s of one task, and of ``tasks`` tasks of one process against it.

    Each run lasts ``seconds``; the one-task figure is held against the
    blocking API's pairs in the same run, the many-task one against the
    one-task figure (goal: :data:`MANY_GOAL` times it on PostgreSQL and
    Elasticsearch — concurrency without a thread per task).
    """
    say(f"{kit.name}: async pairs/s, 1 task and {tasks} tasks")
    from ..locks import lock_tree

    def blocking_pair() -> None:
        with lock_tree(task_path(0), namespace=NAMESPACE, backend=kit.backend):
            pass

    blocking = Rate()
    blocking_pair()
    started = time.perf_counter()
    while (now := time.perf_counter()) < started + seconds:
        blocking_pair()
        blocking.count += 1
    blocking.elapsed = now - started
    one = _run(kit, _tasks_rate(kit.backend, 1, seconds))
    many = _run(kit, _tasks_rate(kit.backend, tasks, seconds))
    goal = ratio_at_least(MANY_GOAL) if kit.name in MANY_GOAL_STORES else None
    return [
        Figure(
            key=f"{kit.name}.async.pair",
            backend=kit.name,
            label="async pairs/s, 1 task",
            value=one.per_second,
            unit="/s",
            baseline_label="blocking lock_tree pairs/s",
            baseline=blocking.per_second,
            extra={"pairs": one.count, "median_pair_s": one.median},
        ),
        Figure(
            key=f"{kit.name}.async.tasks",
            backend=kit.name,
            label=f"async pairs/s, {tasks} tasks, distinct paths",
            value=many.per_second,
            unit="/s",
            baseline_label="1 task",
            baseline=one.per_second,
            goal=goal,
            extra={"tasks": tasks, "pairs": many.count, "median_pair_s": many.median},
        ),
    ]


async def _wake_rounds(kit: StoreKit, pool: WorkerPool, conn: Any, rounds: int) -> list[float]:
    """Each round the worker holds X on :data:`WAKE_PATH`, a task of this loop waits for it, the worker releases."""
    latencies = []
    for round_ in range(WAKE_WARMUP_ROUNDS + rounds):
        conn.send("go")
        if pool.receive(conn) != "held":
            raise RuntimeError("the holder did not take the lock")
        lock = alock_tree(WAKE_PATH, namespace=NAMESPACE, timeout=60, backend=kit.backend)
        waiter = asyncio.ensure_future(lock.acquire())
        try:
            await asyncio.sleep(random.uniform(0.02, 0.08))  # the task is asleep in its wait by now
            if waiter.done():
                raise RuntimeError("the waiting task was granted a lock the worker holds")
        finally:
            conn.send("release")  # whatever failed, the worker must not hold for ever
        try:
            await asyncio.wait_for(waiter, 60)  # a cancelled acquire leaves nothing held
            granted = time.monotonic()
        finally:
            released = pool.receive(conn)  # read only now: a blocking read would hold up the waiting task
        await lock.release()
        if round_ >= WAKE_WARMUP_ROUNDS:
            latencies.append(granted - released)
    return latencies


def wakeup(kit: StoreKit, pool: WorkerPool, rounds: int, say: Say) -> list[Figure]:
    """Release in a worker process → grant to a task waiting in this one, p50 (and p99), against one async pair.

    The latency runs from just before the worker's ``release()`` to the
    return of the waiting task's ``await acquire()``, as the blocking
    wake-up figure runs (the roles swapped: here the waiter is the task).
    """
    say(f"{kit.name}: async wake-up latency, {rounds} rounds")

    async def floor() -> float:
        await _pair(WAKE_PATH, kit.backend)
        times = []
        for _ in range(max(20, rounds)):
            started = time.perf_counter()
            await _pair(WAKE_PATH, kit.backend)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    pair = _run(kit, floor())
    (conn,) = pool.start("hold", kit.config, 1, path=WAKE_PATH, namespace=NAMESPACE)
    try:
        latencies = _run(kit, _wake_rounds(kit, pool, conn, rounds))
    finally:
        conn.send("stop")
    pool.results([conn])
    return [
        Figure(
            key=f"{kit.name}.async.wakeup.p50",
            backend=kit.name,
            label="async wake-up after release, p50",
            value=percentile(latencies, 0.5),
            unit="s",
            baseline_label="one uncontended async pair",
            baseline=pair,
            extra={"rounds": len(latencies), "p99": percentile(latencies, 0.99)},
        )
    ]
