"""The async API on PostgreSQL is native: psycopg's async sessions, waiters woken by LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_esdlock import alock_tree
from django_esdlock.backends.database.postgresql import sessions as aio

from .contract import all_holders
from .dbstores import postgres_store
from .test_async import run


@pytest.fixture
def lock_config(django_db_blocker):
    with django_db_blocker.unblock(), postgres_store() as config:
        yield config


async def _until(predicate, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_calls_run_on_the_loops_own_sessions_not_in_threads(backend, monkeypatch):
    def no_threads(*args, **kwargs):
        raise AssertionError("the async API ran a blocking call in a worker thread")

    monkeypatch.setattr(asyncio, "to_thread", no_threads)
    threads = threading.active_count()

    async def main():
        sessions = backend._sessions()
        locks = [alock_tree(f"/t{i}/x", backend=backend) for i in range(30)]
        await asyncio.gather(*(lock.acquire() for lock in locks))
        assert threading.active_count() <= threads + 1  # the renewer thread at most
        assert isinstance(sessions, aio.LoopSessions) and 1 <= len(sessions._idle) <= backend.async_sessions
        await asyncio.gather(*(lock.release() for lock in locks))

    run(main(), backend)
    assert all_holders(backend) == []


def test_a_release_in_another_process_wakes_the_waiting_task(backend, peer):
    assert peer.acquire("held", scheme="tree", path="/a")["token"]

    async def main():
        sessions = backend._sessions()
        waiter = asyncio.ensure_future(alock_tree("/a/b", backend=backend, timeout=60).acquire())
        await _until(lambda: sessions.waiting)  # refused, listening, and waiting on the listening session
        assert sessions.notifications == 0
        await asyncio.to_thread(peer.release, "held")
        lock = await asyncio.wait_for(waiter, 30)
        await _until(lambda: sessions.notifications == 1)  # the release notified this loop's session
        assert not sessions._waiters  # nobody left registered for wake-ups
        await lock.release()

    run(main(), backend)
    assert all_holders(backend) == []


def test_tasks_queued_on_one_lock_are_woken_one_by_one(backend):
    order = []

    async def main():
        sessions = backend._sessions()
        first = await alock_tree("/q", backend=backend).acquire()

        async def queued(i):
            async with alock_tree("/q", backend=backend, timeout=60):
                order.append(i)

        tasks = []
        for i in range(5):
            tasks.append(asyncio.ensure_future(queued(i)))
            await _until(lambda i=i: len(sessions.waiting) == i + 1)
        await first.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        # Each release notified the head of the queue alone (the last one, nobody), in the order they queued.
        assert order == [0, 1, 2, 3, 4]
        await _until(lambda: sessions.notifications >= 5)
        assert sessions.notifications == 5

    run(main(), backend)
    assert all_holders(backend) == []
