"""A lock belongs to the process that took it: a forked child neither holds nor releases its parent's lock."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from django_esdlock import LockLost, LockUnavailable, alock_tree, conf, lock_tree, signals
from django_esdlock.conf import load_backend
from django_esdlock.core import registry
from django_esdlock.renewal import renewer

from .black_hole import black_holed
from .contract import refused_to_another_owner
from .leases import wait_renewed

# Forking a process that runs threads (the renewer) is the very case under test.
pytestmark = pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")

TTL = 2.0
"""Short leases, so the parent's renewals are seen going on; not so short that a busy machine loses them."""

CHILD_PATIENCE = 60.0
"""Seconds a forked child gets: one that hangs fails the test after this, not the whole run."""


def in_fork(child: Callable[[], Any]) -> Any:
    """Run ``child()`` in a forked child; return what it returned (JSON), or fail with its traceback."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test
        os.close(read)
        try:
            outcome = {"ok": child()}
        except BaseException:  # noqa: BLE001 - reported to the parent
            outcome = {"error": traceback.format_exc()}
        try:
            os.write(write, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    deadline = time.monotonic() + CHILD_PATIENCE
    try:
        while True:
            ready, _, _ = select.select([read], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the forked child did not finish within {CHILD_PATIENCE:g}s (it hangs)")
            chunk = os.read(read, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    outcome = json.loads(b"".join(chunks) or b'{"error": "the child exited without a word"}')
    assert "error" not in outcome, f"the forked child failed:\n{outcome['error']}"
    return outcome["ok"]


def inherited_checks(lock, backend, path: str) -> dict[str, Any]:
    """What a child sees of a lock its parent held at the fork, and what it may still do."""
    seen: dict[str, Any] = {"held": lock.held, "lost": lock.lost, "repr": repr(lock)}
    try:
        lock.check()
        seen["check"] = "passed"
    except LockLost as e:
        seen["check"] = str(e)
    try:
        lock.checkpoint({"by": "child"})
        seen["checkpoint"] = "passed"
    except LockLost:
        seen["checkpoint"] = "LockLost"
    lock.__exit__(None, None, None)  # leaving the with block: raises nothing, removes nothing
    try:
        lock_tree(path, timeout=0, backend=backend).acquire().release()
        seen["parent's node"] = "taken"
    except LockUnavailable:
        seen["parent's node"] = "held by the parent"
    with lock_tree("/fork/child/own", timeout=10, backend=backend) as own:
        seen["own lock"] = own.held
    return seen


def assert_inherited(seen: dict[str, Any], parent: int) -> None:
    assert seen["held"] is False and seen["lost"] is True
    assert f"taken by process {parent} before a fork" in seen["check"]
    assert f"of process {parent}" in seen["repr"]
    assert seen["checkpoint"] == "LockLost"
    assert seen["parent's node"] == "held by the parent"
    assert seen["own lock"] is True


def assert_parent_still_holds(lock, backend, path: str) -> None:
    """The parent's lock is held in the store (nobody else may take it) and its holder is the parent's."""
    lock.check()
    (record,) = [r for r in backend.node_holders(lock.targets[-1][0]) if r.holder_id == lock.holder_id]
    assert record.owner["pid"] == os.getpid()
    assert refused_to_another_owner(path, backend) == "refused"


@pytest.fixture
def backend(store_config):
    backend = load_backend({**store_config, "TTL": TTL})
    yield backend
    backend.close()


def test_os_fork_inside_a_with_block(backend):
    path = "/fork/x"
    with lock_tree(path, backend=backend) as lock:
        seen = in_fork(lambda: inherited_checks(lock, backend, path))
        assert_inherited(seen, os.getpid())
        # The parent is untouched: its renewer goes on past three leases (in the store), its release is a release.
        wait_renewed(backend, lock, leases=3, ttl=TTL)
        assert_parent_still_holds(lock, backend, path)
    assert lock.lost is False and backend.node_holders(lock.targets[-1][0]) == []


def _multiprocessing_child(lock, backend, path: str, conn) -> None:
    try:
        conn.send({"ok": inherited_checks(lock, backend, path)})
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send({"error": traceback.format_exc()})


def test_multiprocessing_fork_start_method(backend):
    path = "/fork/mp"
    context = multiprocessing.get_context("fork")
    with lock_tree(path, backend=backend) as lock:
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_multiprocessing_child, args=(lock, backend, path, send))
        child.start()
        send.close()
        try:
            assert receive.poll(CHILD_PATIENCE), "the multiprocessing child sent nothing (it hangs)"
            outcome = receive.recv()
        finally:
            child.join(CHILD_PATIENCE)
            if child.is_alive():
                child.kill()
        assert "error" not in outcome, outcome.get("error")
        assert child.exitcode == 0
        assert_inherited(outcome["ok"], os.getpid())
        assert_parent_still_holds(lock, backend, path)
    assert backend.node_holders(lock.targets[-1][0]) == []


def test_async_lock_in_a_forked_child(backend):
    path = "/fork/async"

    async def main() -> dict[str, Any]:
        async with alock_tree(path, backend=backend) as lock:

            async def child_side() -> dict[str, Any]:  # runs to its end without giving the loop a turn
                seen: dict[str, Any] = {"held": lock.held}
                try:
                    lock.check()
                except LockLost as e:
                    seen["check"] = str(e)
                try:
                    await lock.checkpoint({"by": "child"})
                except LockLost:
                    seen["checkpoint"] = "LockLost"
                await lock.__aexit__(None, None, None)
                return seen

            def child() -> dict[str, Any]:
                coroutine = child_side()
                try:
                    coroutine.send(None)
                except StopIteration as done:
                    return done.value
                raise AssertionError("the inherited lock's release waited for the store")

            seen = in_fork(child)
            await asyncio.to_thread(assert_parent_still_holds, lock, backend, path)
        await backend.aclose()
        return seen

    seen = asyncio.run(main())
    assert seen["held"] is False and seen["checkpoint"] == "LockLost"
    assert f"taken by process {os.getpid()} before a fork" in seen["check"]
    assert backend.node_holders(lock_tree(path).targets[-1][0]) == []


def module_locks(backend) -> list[Any]:
    """The threading locks a child must find free: the module's, the backend's, a signal's, the renewer's."""
    backend_lock = backend._sole_lock if hasattr(backend, "_sole_lock") else backend._lock
    return [registry._lock, conf._backend_lock, backend_lock, signals.lock_acquired.lock, renewer._cond]


def test_a_child_forked_while_the_renewer_is_in_a_store_call_never_hangs(store_config):
    """The renewer hangs in a black-holed call and another thread holds every module lock at the fork."""
    with black_holed(store_config) as (hole_config, hole):
        backend = load_backend({**hole_config, "TTL": 30})  # its renewal stays in the hole, far from the lease's end
        healthy = load_backend(store_config)
        lock = lock_tree("/fork/busy", backend=backend).acquire()
        hole.open()
        deadline = time.monotonic() + 30
        while not hole.caught():  # the first renewal (after 1 s) goes in and hangs
            assert time.monotonic() < deadline, "no renewal went into the black hole"
            time.sleep(0.01)
        assert renewer.renewing(lock)
        holding, release = threading.Event(), threading.Event()

        def hold_them_all() -> None:
            held = module_locks(backend)
            for each in held:
                each.acquire()
            holding.set()
            release.wait(60)
            for each in reversed(held):
                each.release()

        holder = threading.Thread(target=hold_them_all)
        holder.start()
        assert holding.wait(30)

        def child() -> dict[str, Any]:
            seen: dict[str, Any] = {"free": [each.acquire(timeout=10) for each in module_locks(backend)]}
            for each in module_locks(backend):
                each.release()
            seen["held"] = lock.held
            lock.release()  # through the black hole it would hang: it must not call the store
            with lock_tree("/fork/own", timeout=10, backend=healthy) as own:
                seen["own lock"] = own.held
            conf.reset_backend()
            return seen

        try:
            seen = in_fork(child)
        finally:
            release.set()
            holder.join(30)
        assert seen == {"free": [True] * 5, "held": False, "own lock": True}
        # The parent's renewal comes out of the hole and the lock goes on.
        hole.close()
        renewed = lock._valid_until
        deadline = time.monotonic() + 30
        while lock._valid_until == renewed:
            assert time.monotonic() < deadline and not lock.lost, "the parent's lock was not renewed after the hole"
            time.sleep(0.02)
        assert_parent_still_holds(lock, healthy, "/fork/busy")
        lock.release()
        backend.close()
        healthy.close()
