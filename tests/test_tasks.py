"""Locks in tasks on every store: ``@locked`` and hand-off from a view to a worker (``handoff``/``resume_lock``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import queue
import time

import pytest
from django.test import override_settings

from django_esdlock import (
    InvalidLockArgument,
    LockLost,
    LockUnavailable,
    alock_tree,
    aresume_lock,
    get_backend,
    lock_documents,
    lock_tree,
    locked,
    resume_lock,
)
from django_esdlock.reaper import Reaper
from django_esdlock.records import Owner

from . import (
    handlers,  # noqa: F401  (registers the test recovery handlers)
    locked_tasks,
)
from .contract import all_holders
from .leases import backdate, wait_until
from .peer import SPAWN, setup_django
from .procs import spawned
from .stress import LEAVES

HANDOFF_ROUNDS = 10
"""Hand-offs per store with a contender waiting on the same path."""

TASK_ROUNDS = 20
"""Locked task runs per worker per store, two workers."""


@pytest.fixture
def lock_config(store_config, settings):
    settings.LOCK_BACKEND = store_config  # the decorated tasks use the default backend
    return store_config


def in_another_thread(function):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(function).result(timeout=60)


def owner_keys(backend, path: str, namespace: str = "fs") -> set[str]:
    return {h.owner["key"] for h in all_holders(backend) if h.node.key == path and h.node.namespace == namespace}


# --- hand-off, in one process ----------------------------------------------------


def test_handoff_gives_the_worker_the_lock_with_a_larger_token(lock_config, backend, tmp_path):
    intent = {"op": "test-append", "file": str(tmp_path / "runs.jsonl")}
    with lock_tree("/clinton", namespace="fs", intent=intent, backend=backend) as view:
        view.checkpoint({"done": 3})
        view_owner, view_token, view_holder = owner_keys(backend, "/clinton"), view.token, view.holder_id
        ticket = view.handoff(ttl=30)
        assert isinstance(ticket, str) and len(ticket) < 400
        assert view.handed_off and not view.held
        with pytest.raises(LockLost, match="handed off"):
            view.check()
    # Leaving the view's block gave nothing back: the ticket's holder still holds it.
    with pytest.raises(LockUnavailable):
        lock_tree("/clinton", namespace="fs", timeout=0, backend=backend).acquire()

    def work():  # another thread: another owner, as a worker process is
        with resume_lock(ticket, backend=backend) as worker:
            assert worker.token > view_token and worker.holder_id == view_holder
            assert worker.intent == intent and worker.last_checkpoint == {"done": 3}
            (record,) = [h for h in all_holders(backend) if h.node.key == "/clinton"]
            assert record.owner["key"] not in view_owner and record.owner["key"] == Owner.current().key
            assert record.intent == intent and record.checkpoint == {"done": 3} and record.recovery is None
            worker.checkpoint({"done": 4})

    in_another_thread(work)
    assert all_holders(backend) == []


def test_the_claim_fences_off_the_view(lock_config, backend):
    view = lock_tree("/a/b", namespace="fs", backend=backend).acquire()
    view_token = view.token
    ticket = view.handoff()
    view.release()  # a no-op now
    worker = in_another_thread(resume_lock(ticket, backend=backend).acquire)
    assert worker.token > view_token
    with pytest.raises(LockLost):  # a ticket is claimed once: a task delivered twice gets LockLost
        resume_lock(ticket, backend=backend).acquire()
    worker.release()  # from here: the renewer and the store care about the owner, not the thread
    with pytest.raises(LockLost):  # and not after the worker released it either
        resume_lock(ticket, backend=backend).acquire()


def test_an_expired_ticket_raises_lock_lost(lock_config, backend):
    view = lock_tree("/late", namespace="fs", ttl=30, backend=backend).acquire()
    holder = view.holder_id
    ticket = view.handoff(ttl=30)
    backdate(lock_config, holder)  # the ticket's lease ran out, by the store's clock
    with pytest.raises(LockLost, match="lease ran out"):
        with resume_lock(ticket, backend=backend):
            pytest.fail("an expired ticket was claimed")
    with lock_tree("/late", namespace="fs", timeout=0, backend=backend):
        pass  # the unclaimed holder carried no intent: the next acquisition evicted it


def test_an_unclaimed_ticket_with_intent_is_recovered_by_the_reaper(lock_config, backend, tmp_path):
    out = tmp_path / "runs.jsonl"
    view = lock_tree("/job", namespace="fs", intent={"op": "test-append", "file": str(out)}, backend=backend)
    view.acquire()
    view.checkpoint({"done": 7})
    holder = view.holder_id
    ticket = view.handoff(ttl=30)
    backdate(lock_config, holder)
    with pytest.raises(LockUnavailable):  # expired, but its intent keeps it until recovered
        lock_tree("/job", namespace="fs", timeout=0, backend=backend).acquire()
    report = Reaper(backend).run()
    assert len(report.recovered) == 1
    (run,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert run["checkpoint"] == {"done": 7}
    with pytest.raises(LockLost):
        resume_lock(ticket, backend=backend).acquire()
    assert all_holders(backend) == []


def test_a_forged_ticket_is_refused_before_any_request(backend):
    with pytest.raises(InvalidLockArgument):
        resume_lock("not-a-ticket", backend=backend)
    view = lock_tree("/x", backend=backend).acquire()
    ticket = view.handoff()
    with pytest.raises(InvalidLockArgument):
        resume_lock(ticket[:-2] + ("A" if ticket[-2] != "A" else "B") + ticket[-1], backend=backend)
    resume_lock(ticket, backend=backend).acquire().release()


def test_async_handoff_and_resume(lock_config, backend):
    async def main():
        try:
            async with alock_tree("/async", namespace="fs", backend=backend) as view:
                ticket = await view.handoff(ttl=10)
            async with aresume_lock(ticket, backend=backend) as worker:
                assert worker.token > 0 and worker.held
                other = alock_tree("/async/x", namespace="fs", timeout=0, backend=backend)
                with pytest.raises(LockUnavailable):  # another task: another holder
                    await asyncio.create_task(other.acquire())
            async with alock_tree("/async", namespace="fs", timeout=0, backend=backend):
                pass
            # @locked on a coroutine function: its own acquisition, then a ticket's claim.
            plain = await locked_tasks.arename("/async")
            view = await alock_tree("/async", namespace="fs", backend=backend).acquire()
            view_holder = view.holder_id
            resumed = await locked_tasks.arename("/async", ticket=await view.handoff())
            assert not plain["resumed"] and resumed["resumed"] and resumed["token"] > plain["token"]
            assert resumed["holder"] == view_holder
        finally:
            await backend.aclose()
            await get_backend().aclose()  # the decorated function's: the settings' backend

    asyncio.run(asyncio.wait_for(main(), 60))


def documents_held(backend) -> dict[str, str]:
    """The owner key holding each document of namespace ``orders``."""
    return {h.node.key: h.owner["key"] for h in all_holders(backend) if h.node.namespace == "orders"}


def test_a_ticket_that_does_not_cover_the_tasks_documents_is_refused_before_the_task_runs(lock_config, backend, caplog):
    """The view held doc 1, locked [1, 2] and handed that lock off: its ticket covers doc 2 only."""
    locked_tasks.SHIPPED.clear()
    view_owner = Owner.current().key
    with lock_documents(["1"], namespace="orders", backend=backend):
        with lock_documents(["1", "2"], namespace="orders", backend=backend) as view:
            view_holder = view.holder_id
            ticket = view.handoff(ttl=30)
        assert documents_held(backend) == {"1": view_owner, "2": view_owner}
        assert "without orders:doc:1, held by its owner under another lock" in caplog.text  # said in the view

        def work():  # another thread: another owner, as a worker process is
            with pytest.raises(InvalidLockArgument, match=r"does not cover .*orders:doc:1"):
                locked_tasks.ship_handed(["1", "2"], ticket=ticket)
            for resume in (resume_lock, aresume_lock):  # nothing declared: the ticket's own lock must be whole
                with pytest.raises(InvalidLockArgument, match=r"does not cover .*orders:doc:1"):
                    resume(ticket, backend=backend)

        in_another_thread(work)
        assert locked_tasks.SHIPPED == []  # the task's body never ran
        # Nothing was claimed: doc 2 is still the handed-off holder, under the view's owner.
        assert documents_held(backend) == {"1": view_owner, "2": view_owner}
        assert {h.holder_id for h in all_holders(backend) if h.node.key == "2"} == {view_holder}
    # A task that names only what the ticket covers gets it; so does a whole ticket.
    covered = in_another_thread(lambda: locked_tasks.ship_handed(["2"], ticket=ticket))
    assert covered == {"holder": view_holder, "documents": ["2"]}
    with lock_documents(["1", "2"], namespace="orders", backend=backend) as view:
        ticket = view.handoff(ttl=30)
    whole = in_another_thread(lambda: locked_tasks.ship_handed(["2", "1"], ticket=ticket))
    assert whole["documents"] == ["1", "2"] and locked_tasks.SHIPPED == [["2"], ["1", "2"]]
    with pytest.raises(InvalidLockArgument, match="the ticket locks"):  # one that covers more is refused too
        ticket = lock_documents(["1", "2", "3"], namespace="orders", backend=backend).acquire().handoff()
        locked_tasks.ship_handed(["1", "2"], ticket=ticket)
    resume_lock(ticket, backend=backend).acquire().release()
    assert all_holders(backend) == []


# --- @locked ------------------------------------------------------------------------


def test_locked_plain_function_with_and_without_a_ticket(lock_config, backend, tmp_path):
    dst = str(tmp_path / "runs.jsonl")
    plain = locked_tasks.rename("/docs", dst)
    assert plain["intent"] == {"op": "test-append", "file": dst} and plain["checkpoint"] is None
    view = lock_tree("/docs", namespace="fs", intent={"op": "test-append", "file": dst}, backend=backend)
    with view:
        view.checkpoint({"done": 1})
        view_holder = view.holder_id
        ticket = view.handoff()
        with pytest.raises(LockUnavailable):  # the task's own acquisition would not get it...
            locked_tasks.rename("/docs", dst)
        resumed = locked_tasks.rename("/docs", dst, ticket=ticket)  # ...the ticket hands it over
    assert resumed["holder"] == view_holder and resumed["checkpoint"] == {"done": 1}
    assert resumed["token"] > plain["token"]
    with pytest.raises(InvalidLockArgument, match="the ticket locks"):
        ticket = lock_tree("/other", namespace="fs", backend=backend).acquire().handoff()
        locked_tasks.rename("/docs", dst, ticket=ticket)
    resume_lock(ticket, backend=backend).acquire().release()
    assert all_holders(backend) == []


def test_locked_django_task_fails_with_the_lock_exception(lock_config, backend, peer):
    locked_tasks.SHARED.update(
        counters=[0] * len(LEAVES), last_tokens=[0] * len(LEAVES), violations=type("V", (), {"value": 0})()
    )
    with override_settings(TASKS={"default": {"BACKEND": locked_tasks.IMMEDIATE_BACKEND}}):
        result = locked_tasks.bump.enqueue("/r/a")
        assert result.status == "SUCCESSFUL" and result.return_value > 0
        peer.acquire("held", scheme="tree", path="/r", namespace="tasks")
        timed_out = locked(tree="/r/a", namespace="tasks", timeout=0)(lambda: None)
        with pytest.raises(LockUnavailable):
            timed_out()
        peer.release("held")


def test_locked_documents_and_global_locks(lock_config, backend, peer):
    assert locked_tasks.ship(["2", "1"]) > 0 and locked_tasks.nightly("export") == "export"
    peer.acquire("doc", scheme="documents", ids=["2"], namespace="orders")
    peer.acquire("job", scheme="global", name="nightly-export")
    with pytest.raises(LockUnavailable):
        locked_tasks.ship(["1", "2", "3"])  # all or nothing
    with pytest.raises(LockUnavailable):
        locked_tasks.nightly("export")
    assert locked_tasks.ship(["1", "3"]) > 0 and locked_tasks.nightly("import") == "import"
    peer.release("doc")
    peer.release("job")
    assert all_holders(backend) == []


def test_locked_arguments_are_checked():
    with pytest.raises(InvalidLockArgument):
        locked(tree="/a", name="b")
    with pytest.raises(InvalidLockArgument):
        locked(name="b", intent={"op": "x"})
    with pytest.raises(InvalidLockArgument, match="no parameter"):
        locked(tree="/a", ticket="ticket")(lambda src: None)


# --- real processes -------------------------------------------------------------------


def _use(config):
    setup_django()
    override_settings(LOCK_BACKEND=config).enable()


def _task_worker(config, counters, last_tokens, violations, rounds, seed, use_async, me, progress, barrier):
    """Run at least ``rounds`` locked tasks on random paths of the stress tree, from a common start.

    Go on (bounded) until the other worker has run a task while this one was
    running its own: the two really overlapped. Return how often each leaf
    was bumped and whether they overlapped.
    """
    import random

    _use(config)
    from tests import locked_tasks as tasks
    from tests.stress import LEAVES, TREE, leaves_under

    tasks.SHARED.update(counters=counters, last_tokens=last_tokens, violations=violations)
    rng = random.Random(seed)
    tally = [0] * len(LEAVES)
    barrier.wait(60)
    other_at_start, overlapped, done = progress[1 - me], False, 0
    while done < rounds or (not overlapped and done < 50 * rounds):
        path = rng.choice(TREE)
        if use_async:
            asyncio.run(tasks.abump(path))
        else:
            tasks.bump.call(path)
        for i in leaves_under(path):
            tally[i] += 1
        done += 1
        progress[me] = done
        # The other ran a task while this one was running its own: both were at work at once.
        overlapped = overlapped or progress[1 - me] != other_at_start
    return tally, overlapped


def test_two_workers_never_run_conflicting_locked_tasks_at_once(lock_config):
    counters = SPAWN.Array("q", len(LEAVES), lock=False)
    last_tokens = SPAWN.Array("q", len(LEAVES), lock=False)
    violations = SPAWN.Value("q", 0, lock=False)
    progress, barrier = SPAWN.Array("q", 2), SPAWN.Barrier(2)
    args = [
        (lock_config, counters, last_tokens, violations, TASK_ROUNDS, seed, seed == 1, seed, progress, barrier)
        for seed in range(2)
    ]
    with spawned(_task_worker, args) as workers:
        outcomes = workers.results(timeout=180)
    assert all(overlapped for _, overlapped in outcomes), f"the workers never ran at once: {list(progress)} tasks"
    expected = [sum(column) for column in zip(*(tally for tally, _ in outcomes), strict=True)]
    assert list(counters) == expected, "a locked task ran while a conflicting one did"
    assert violations.value == 0


def _handoff_worker(config, tickets, done, inside, violations) -> int:
    """Claim each ticket, check nobody else is inside, hold a moment, leave; stop at None."""
    _use(config)
    from django_esdlock import resume_lock

    claimed = 0
    while (ticket := tickets.get(timeout=60)) is not None:
        with resume_lock(ticket) as lock:
            if inside.value != 1:  # the view's entry, and no one else's
                violations.value += 1
            time.sleep(0.01)
            inside.value -= 1
            lock.check()
        claimed += 1
        done.put(claimed)
    return claimed


def _contender(config, stop, inside, violations, ready) -> int:
    """Take the same path again and again, waiting for it; count the times anyone else was inside."""
    _use(config)
    from django_esdlock import lock_tree

    ready.set()
    taken = 0
    while not stop.is_set():
        with lock_tree("/clinton/README.txt", namespace="fs", timeout=30):
            inside.value += 1
            if inside.value != 1:
                violations.value += 1
            time.sleep(0.002)
            inside.value -= 1
            taken += 1
    return taken


def test_no_process_slips_in_between_view_and_worker(lock_config, backend):
    tickets, done = SPAWN.Queue(), SPAWN.Queue()
    inside, violations, stop = SPAWN.Value("q", 0), SPAWN.Value("q", 0), SPAWN.Event()
    ready = SPAWN.Event()
    workers = [(lock_config, tickets, done, inside, violations)]
    with (
        spawned(_handoff_worker, workers) as worker,
        spawned(_contender, [(lock_config, stop, inside, violations, ready)]) as contender,
    ):
        # On a loaded machine the rounds could all end before the contender has started.
        deadline = time.monotonic() + 60
        while not ready.wait(0.2):
            contender.check()
            assert time.monotonic() < deadline, "the contender did not start within 60 s"
        for round_ in range(HANDOFF_ROUNDS):
            with lock_tree("/clinton/README.txt", namespace="fs", timeout=30, backend=backend) as view:
                inside.value += 1
                if inside.value != 1:
                    violations.value += 1
                # The contender queues up behind the view: the hand-off must beat a waiter, not an empty node.
                wait_until(
                    lambda: (
                        contender.check() or any(w.holder_id != view.holder_id for w in backend.wait_state().waiters)
                    ),
                    what=f"round {round_}: the contender's waiting marker",
                )
                tickets.put(view.handoff(ttl=30))
            # The worker's claim and release, while the contender waits for the path.
            deadline = time.monotonic() + 60
            while True:
                worker.check()
                contender.check()
                try:
                    assert done.get(timeout=0.2) == round_ + 1
                    break
                except queue.Empty:
                    assert time.monotonic() < deadline, "the worker claimed nothing for 60 s"
        tickets.put(None)
        stop.set()
        (claimed,) = worker.results(timeout=60)
        (taken,) = contender.results(timeout=60)
    assert claimed == HANDOFF_ROUNDS and violations.value == 0
    assert taken > 0, "the contender never got the path: it did not contend"
