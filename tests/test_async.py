"""What only the async API has: tasks as holders, cancellation, many tasks in one process; on every store."""

from __future__ import annotations

import asyncio
import random

import pytest

from django_esdlock import LockDeadlock, LockUnavailable, aglobal_lock, alock_documents, alock_tree

from .contract import all_holders

ROUNDS = 60
"""Cancellation rounds per store."""


@pytest.fixture
def lock_config(store_config):
    return store_config


def run(coroutine, backend, timeout: float = 120):
    """Run ``coroutine`` on a new event loop, closing the backend's connections of that loop after it."""

    async def main():
        try:
            return await asyncio.wait_for(coroutine, timeout)
        finally:
            await backend.aclose()

    return asyncio.run(main())


def test_two_tasks_of_one_thread_are_two_holders(backend):
    async def main():
        async with alock_documents(["1"], backend=backend):
            # Another task, same thread: not the same owner, so not reentrant.
            with pytest.raises(LockUnavailable):
                await asyncio.create_task(alock_documents(["1"], timeout=0, backend=backend).acquire())
            # The same task: a no-op, as for a thread.
            async with alock_documents(["1", "2"], timeout=0, backend=backend):
                pass

    run(main(), backend)
    assert all_holders(backend) == []


def test_a_task_waiting_on_what_it_holds_is_a_deadlock(backend):
    async def main():
        async with alock_tree("/a/b", backend=backend):
            with pytest.raises(LockDeadlock, match="this task already holds"):
                await alock_tree("/a", backend=backend).acquire()  # timeout=None: would wait forever

            async def other_task():  # holds nothing: it waits, and gives up at its timeout
                with pytest.raises(LockUnavailable):
                    await alock_tree("/a", timeout=0.2, backend=backend).acquire()

            await asyncio.create_task(other_task())

    run(main(), backend)


def test_the_decorator_acquires_on_each_call(backend):
    @aglobal_lock("nightly", timeout=0, backend=backend)
    async def job():
        return {h.node.key for h in await asyncio.to_thread(all_holders, backend)}

    assert run(job(), backend) == {"nightly"}
    assert run(job(), backend) == {"nightly"}
    assert all_holders(backend) == []


def test_cancelled_while_holding_still_releases(backend):
    async def main():
        entered = asyncio.Event()

        async def holder():
            async with alock_tree("/held", backend=backend):
                entered.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(holder())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main(), backend)
    assert all_holders(backend) == []


def test_cancellation_at_random_points_of_acquire_leaves_nothing(backend):
    """Cancel acquires (some contended, some free) at random moments; afterwards nothing may be held."""
    rng = random.Random(7)

    outcomes = {"cancelled": 0, "acquired": 0}

    async def main():
        blocker = await alock_tree("/c/busy", backend=backend).acquire()
        for i in range(ROUNDS):
            path = "/c/busy" if i % 3 == 0 else f"/c/free{i % 4}"
            lock = alock_tree(path, backend=backend)
            task = asyncio.create_task(lock.acquire())
            await asyncio.sleep(rng.uniform(0, 0.02))
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                assert not lock.held  # a grant that came back after the cancel was given back
                outcomes["cancelled"] += 1
            else:
                await lock.release()  # acquired before the cancel landed
                outcomes["acquired"] += 1
        await blocker.release()

    run(main(), backend, timeout=300)
    assert outcomes["cancelled"] >= ROUNDS // 3  # every try on the busy path, at least
    assert all_holders(backend) == []


def test_timeout_by_asyncio_leaves_nothing(backend):
    async def main():
        async with alock_tree("/t", backend=backend):

            async def late():
                async with asyncio.timeout(0.3):
                    await alock_tree("/t", backend=backend).acquire()

            with pytest.raises(TimeoutError):
                await asyncio.create_task(late())

    run(main(), backend)
    assert all_holders(backend) == []


@pytest.mark.slow
def test_a_hundred_tasks_contending_for_one_tree_never_overlap(backend):
    """100 tasks, one process: exclusive holds of a subtree never overlap, fencing tokens only grow."""
    tasks, rounds = 100, 3
    paths = ["/r", "/r/a", "/r/b", "/r/a/x"]
    inside: dict[str, int] = {}
    overlaps: list[str] = []
    entries: list[tuple[str, int]] = []  # (path, token) in the order the holds began

    def covers(path: str) -> list[str]:
        return [p for p in paths if p == path or p.startswith(path + "/") or path.startswith(p + "/")]

    async def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(rounds):
            path = rng.choice(paths)
            async with alock_tree(path, backend=backend) as lock:
                if any(inside.get(p) for p in covers(path)):
                    overlaps.append(path)
                inside[path] = inside.get(path, 0) + 1
                entries.append((path, lock.token))
                await asyncio.sleep(rng.uniform(0, 0.003))
                inside[path] -= 1

    async def main():
        await asyncio.gather(*(worker(seed) for seed in range(tasks)))

    run(main(), backend, timeout=600)
    assert overlaps == []
    assert len(entries) == tasks * rounds
    # Fencing: a hold's token exceeds that of every earlier hold it conflicts with (those had ended).
    for i, (path, token) in enumerate(entries):
        older = [t for p, t in entries[:i] if p in covers(path)]
        assert all(t < token for t in older), (path, token, max(older))
    assert all_holders(backend) == []
