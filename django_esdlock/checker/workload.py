"""The workload: a spawned process that takes random locks and records each step into its history file."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import faulthandler
import logging
import os
import random
import time
import traceback
from collections.abc import Callable, Generator, Mapping
from typing import Any

from ..recovery import recovery_handler

INTENT_OP = "django_esdlock.lock_check"
"""The intent op of the workload's changes; the command's reaper recovers them."""

READY_TIMEOUT = 120.0
"""Seconds a worker waits for the command's "go" (every worker started)."""

TREE_NAMES = ("a", "b")
TREE_DEPTH = 3
DOCUMENT_IDS = tuple(str(i) for i in range(1, 7))
SEMAPHORE_NAME = "slots"
SEMAPHORE_LIMIT = 2
"""The workload's one semaphore: at most this many of its holders at once (check (a))."""

# Counters each worker keeps for the progress line, per slot: operations, grants, losses.
COUNTERS = 3


def guarded_keys(global_name: str) -> list[str]:
    """Every record the workload may append to: each tree path, each document id, the global lock."""
    from .guarded import data_key

    paths = [""]
    tree: list[str] = []
    for _ in range(TREE_DEPTH):
        paths = [f"{path}/{name}" for path in paths for name in TREE_NAMES]
        tree += paths
    nodes = [["", "tree", path] for path in tree] + [["", "doc", i] for i in DOCUMENT_IDS]
    return [data_key(node) for node in [*nodes, ["", "global", global_name]]]


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """What every worker of a run is given (picklable: it crosses the spawn)."""

    config: dict[str, Any]
    namespace: str
    global_name: str
    ttl: float
    max_hold: float
    max_timeout: float
    history_dir: str
    settings_module: str | None
    seed: int
    guarded: Any = None
    """The run's guarded data (a :class:`~.guarded.GuardedStore`), or None: no data writes."""
    semaphores: float = 0.1
    """Share of requests for the semaphore (``CheckOptions.semaphores``)."""


class ClockSkew:
    """This worker's wall clock, set off by the clock fault (``shared["clock"][slot]`` seconds) and back.

    time-machine's ``travel(..., tick=True)`` moves ``time.time`` and
    ``datetime.now`` of the whole process (its renewer thread too) and leaves
    the monotonic clock and timed waits alone, as NTP skew does. libfaketime
    does not do for this: it moves the monotonic clock too (or, with
    ``DONT_FAKE_MONOTONIC=1``, makes ``time.sleep`` fail with EINVAL).
    """

    def __init__(self, offsets: Any, slot: int) -> None:
        self.offsets = offsets
        self.slot = slot
        self.offset = 0.0
        self._travel: Any = None

    def follow(self) -> None:
        """Take up the offset the command set for this worker, if it changed."""
        offset = self.offsets[self.slot]
        if offset == self.offset:
            return
        import time_machine  # the command skips the clock fault where it is missing

        if self._travel is not None:
            self._travel.stop()
            self._travel = None
        if offset:
            self._travel = time_machine.travel(time.time() + offset, tick=True)
            self._travel.start()
        self.offset = offset


def node_list(targets: Any) -> list[list[str]]:
    """Return the (namespace, kind, key, mode) of each (node, mode) a lock takes, for the history."""
    return [[node.namespace, node.kind.value, node.key, mode.value] for node, mode in targets]


class Workload:
    """Random requests against one backend, recorded: the body of a worker process."""

    def __init__(self, spec: WorkloadSpec, process: str, rng: random.Random, history: Any, backend: Any) -> None:
        self.spec = spec
        self.process = process
        self.rng = rng
        self.history = history
        self.backend = backend
        self.count = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ops_of_locks: dict[int, str] = {}
        self.data = spec.guarded.open() if spec.guarded is not None else None

    # --- what to ask for -----------------------------------------------------

    ASYNC_SHARE = 0.25
    """Share of requests made through the async API (``alock_tree`` ...) on the worker's event loop."""

    NESTED_SHARE = 0.3
    """Share of holds that take a second lock inside the first (the nested ``with`` blocks deadlocks come from)."""

    def random_lock(self, api: str | None = None) -> tuple[str, str, Any, bool]:
        """Return (kind, api, lock, has intent) of a random request (through ``api`` if given)."""
        from .. import aio, locks

        spec, rng = self.spec, self.rng
        if api is None:
            api = "async" if rng.random() < self.ASYNC_SHARE else "sync"
        module: Any = aio if api == "async" else locks
        prefix = "a" if api == "async" else ""
        common = {"timeout": 0.0 if rng.random() < 0.2 else round(rng.uniform(0.05, spec.max_timeout), 3)}
        common.update(ttl=spec.ttl, backend=self.backend)
        if rng.random() < spec.semaphores:
            semaphore = getattr(module, f"{prefix}semaphore")(
                SEMAPHORE_NAME, SEMAPHORE_LIMIT, namespace=spec.namespace, **common
            )
            return "semaphore", api, semaphore, False
        roll = rng.random()
        if roll < 0.6:
            path = "/" + "/".join(rng.choice(TREE_NAMES) for _ in range(rng.randint(1, TREE_DEPTH)))
            shared = rng.random() < 0.35
            intent = None
            if not shared and rng.random() < 0.35:
                intent = {"op": INTENT_OP, "run": spec.namespace, "op_id": f"{self.process}-{self.count}"}
            lock_tree = getattr(module, f"{prefix}lock_tree")
            lock = lock_tree(path, shared=shared, namespace=spec.namespace, intent=intent, **common)
            return "tree", api, lock, intent is not None
        if roll < 0.85:
            ids = rng.sample(DOCUMENT_IDS, rng.randint(1, 3))
            return (
                "documents",
                api,
                getattr(module, f"{prefix}lock_documents")(ids, namespace=spec.namespace, **common),
                False,
            )
        return "global", api, getattr(module, f"{prefix}global_lock")(spec.global_name, **common), False

    # --- one operation ---------------------------------------------------------
    #
    # Written once as a generator of steps (acquire, sleep, checkpoint, release)
    # that a blocking and an async driver run: the same workload through both APIs.

    def on_lost(self, lock: Any, reason: str) -> None:
        """Receiver of ``lock_lost``: the renewer (or a release) told the holder."""
        op_id = self._ops_of_locks.get(id(lock))
        if op_id is not None:
            self.history.record("lost", op=op_id, how=f"lock_lost signal: {reason}")

    def run_one(self, set_holding: Callable[[int], None], bump: Callable[[int], None]) -> None:
        kind, api, lock, has_intent = self.random_lock()
        op_id = f"{self.process}-{self.count}"
        self.count += 1
        steps = self._steps(op_id, kind, api, lock, has_intent, set_holding, bump)
        if api == "sync":
            _drive(steps, _blocking_step)
        else:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            self.loop.run_until_complete(_adrive(steps, _async_step))

    def close(self) -> None:
        if self.data is not None:
            with contextlib.suppress(Exception):
                self.data.close()
        if self.loop is not None:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.backend.aclose())
            self.loop.close()

    def _steps(
        self,
        op_id: str,
        kind: str,
        api: str,
        lock: Any,
        has_intent: bool,
        set_holding: Callable[[int], None],
        bump: Callable[[int], None],
        outer: str | None = None,
    ) -> Generator[tuple[Any, ...], Any, None]:
        """The steps of one request and its hold; ``outer``: the op id of the hold it is nested in."""
        from ..exceptions import (
            LockBackendUnavailable,
            LockDeadlock,
            LockError,
            LockLost,
            LockTimeout,
            LockUnavailable,
        )

        hold = round(self.rng.uniform(0.0, self.spec.max_hold), 3)
        record = self.history.record
        nodes = node_list(lock.targets)
        invoke = {"kind": kind, "api": api, "nodes": nodes, "timeout": lock.timeout, "hold": hold}
        if lock.holder_limit is not None:
            invoke["limit"] = lock.holder_limit
        record("invoke", op=op_id, **invoke, intent=lock.intent, **({"outer": outer} if outer else {}))
        bump(0)
        try:
            yield ("acquire", lock)
        except LockDeadlock as e:  # cycle: how many owners waited for each other (0: for itself)
            record("fail", op=op_id, outcome="deadlock", error=str(e), cycle=len(e.cycle.requests) if e.cycle else 0)
            return
        except LockTimeout as e:
            record("fail", op=op_id, outcome="timeout", error=str(e))
            return
        except LockUnavailable as e:
            record("fail", op=op_id, outcome="unavailable", error=str(e))
            return
        except LockBackendUnavailable as e:
            record("fail", op=op_id, outcome="store_unavailable", error=str(e))
            yield (
                "sleep",
                None,
                self.rng.uniform(0.05, 0.2),
            )  # as an app would, rather than hammer a store that is down
            return
        except Exception:  # noqa: BLE001 - an unexpected end is what check (c) reports
            record("fail", op=op_id, outcome="error", error=traceback.format_exc())
            return
        self._ops_of_locks[id(lock)] = op_id
        record("ok", op=op_id, holder=lock.holder_id, token=lock.token)
        bump(1)
        set_holding(2 if has_intent else 1)
        try:
            seen = yield from self._append(op_id, lock, nodes)
            if outer is None and self.rng.random() < self.NESTED_SHARE:
                yield from self._nested(op_id, api, lock, bump)
            yield from self._hold(op_id, lock, hold, has_intent, seen)
        finally:
            t = time.monotonic()
            valid = not lock.lost
            if not valid:
                record("lost", op=op_id, how="lock.lost before release", t=t)
            record("release", op=op_id, valid=valid, t=t)
            set_holding(0)
            outcome, error = "ok", None
            try:
                yield ("release", lock)
            except LockLost as e:
                outcome, error = "lost", str(e)
                record("lost", op=op_id, how="LockLost at release")
            except LockBackendUnavailable as e:
                outcome, error = "store_unavailable", str(e)
            except LockError as e:
                outcome, error = "error", repr(e)
            self._ops_of_locks.pop(id(lock), None)
            if outcome == "lost":
                bump(2)
            record("released", op=op_id, outcome=outcome, error=error)

    def _append(
        self, op_id: str, lock: Any, nodes: list[list[str]], seen: dict[str, list[str]] | None = None
    ) -> Generator[tuple[Any, ...], Any, dict[str, list[str]]]:
        """Append ``op_id`` to the guarded record of each node the lock holds in X; return the lists as this holder
        believes them now (read, and its append where it was written).

        With ``seen`` (those beliefs), the late append of a holder told of its
        loss: its bare token and what it believed, as a holder that did not
        look would write.
        """
        from .guarded import ERROR, OK, data_key

        if self.data is None:
            return {}
        late = seen is not None
        read: dict[str, list[str]] = {}
        for node in nodes:
            if node[3] != "X":
                continue
            key = data_key(node)
            item = f"{op_id}-late" if late else op_id
            error = None
            try:
                read[key] = seen[key] if late and key in seen else (yield ("call", self.data.read, key))
                token = lock.token if late else lock
                outcome = yield ("call", self.data.append, key, read[key], item, token, not late)
            except Exception as e:  # noqa: BLE001 - an append that failed may or may not have landed
                outcome, error = ERROR, repr(e)[:300]
            self.history.record(
                "append", op=op_id, key=key, item=item, token=lock.token, outcome=outcome, late=late, error=error
            )
            if outcome == OK:  # what this holder believes the list is now: its late append builds on it
                read[key] = [*read[key], item]
        return read

    def _hold(
        self, op_id: str, lock: Any, hold: float, has_intent: bool, seen: dict[str, list[str]] | None = None
    ) -> Generator[tuple[Any, ...], Any, None]:
        """Act under the lock for ``hold`` seconds: writes stamped with the token, checkpoints with an intent.

        Each write records whether ``lock.lost`` was False when it began. After
        a loss the worker makes one more write, the late write of a holder
        that did not look: fencing must refuse it (and one more append to the
        guarded data, if the run has any).
        """
        from ..exceptions import LockBackendUnavailable, LockLost

        record = self.history.record
        end = time.monotonic() + hold
        step = 0
        while True:
            t = time.monotonic()
            valid = not lock.lost
            record("write", op=op_id, token=lock.token, valid=valid, t=t)
            if not valid:
                record("lost", op=op_id, how="lock.lost", t=t)
                if seen:
                    yield from self._append(op_id, lock, node_list(lock.targets), seen)
                return
            if t >= end:
                return
            step += 1
            if has_intent and step % 3 == 0:
                # Recorded before the call too: a holder killed while the
                # call is in flight may have had it stored all the same.
                record("checkpoint", op=op_id, data={"step": step}, outcome="invoked")
                try:
                    yield ("checkpoint", lock, {"step": step})
                except LockLost:
                    record("checkpoint", op=op_id, data={"step": step}, outcome="lost")
                    record("lost", op=op_id, how="LockLost at checkpoint")
                    return
                except LockBackendUnavailable as e:
                    record("checkpoint", op=op_id, data={"step": step}, outcome="store_unavailable", error=str(e))
                else:
                    record("checkpoint", op=op_id, data={"step": step}, outcome="ok")
            yield ("sleep", None, min(self.rng.uniform(0.01, 0.04), max(0.0, end - time.monotonic())))

    def _nested(
        self, outer: str, api: str, held: Any, bump: Callable[[int], None]
    ) -> Generator[tuple[Any, ...], Any, None]:
        """Take a second random lock inside the hold of ``held`` (same API), hold it, let it go.

        Document ids the holder has already are left out: taking them again
        is the chapter's no-op, not a grant the checker could judge. A second
        lock that conflicts with the first ends in LockDeadlock at once; two
        holders waiting for each other, in a cycle the store's detection
        breaks (one of them ends in LockDeadlock).
        """
        kind, _, lock, has_intent = self.random_lock(api)
        held_ids = {key for namespace, k, key, _ in node_list(held.targets) if k == "doc"}
        if kind == "documents" and held_ids & {key for _, _, key, _ in node_list(lock.targets)}:
            return
        op_id = f"{self.process}-{self.count}"
        self.count += 1
        yield from self._steps(op_id, kind, api, lock, has_intent, lambda value: None, bump, outer=outer)


def _blocking_step(step: tuple[Any, ...]) -> Any:
    """Do one step ``(what, lock, argument...)``: acquire, release, checkpoint or sleep (no lock)."""
    what, lock, *args = step
    if what == "sleep":
        return time.sleep(*args)
    if what == "call":  # the guarded data: ``lock`` is the function
        return lock(*args)
    return getattr(lock, what)(*args)


async def _async_step(step: tuple[Any, ...]) -> Any:
    what, lock, *args = step
    if what == "sleep":
        return await asyncio.sleep(*args)
    if what == "call":  # blocking (the ORM, the blocking client): in a thread, as an async app would
        return await asyncio.to_thread(lock, *args)
    return await getattr(lock, what)(*args)


def _drive(steps: Generator[tuple[Any, ...], Any, None], do: Callable[[tuple[Any, ...]], Any]) -> None:
    """Run ``steps`` with blocking calls: each step's result is sent back, its exception thrown in."""
    outcome: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(outcome)
        except StopIteration:
            return
        outcome, error = None, None
        try:
            outcome = do(step)
        except Exception as e:  # noqa: BLE001 - handed to the generator, which decides
            error = e


async def _adrive(steps: Generator[tuple[Any, ...], Any, None], do: Callable[[tuple[Any, ...]], Any]) -> None:
    """Run ``steps`` with awaited calls, as :func:`_drive` does."""
    outcome: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(outcome)
        except StopIteration:
            return
        outcome, error = None, None
        try:
            outcome = await do(step)
        except Exception as e:  # noqa: BLE001 - handed to the generator, which decides
            error = e


def worker_main(spec: WorkloadSpec, slot: int, process: str, shared: Mapping[str, Any]) -> None:
    """Body of one spawned worker: set Django up, wait for "go", run requests until the stop time."""
    faulthandler.enable()  # a worker that crashes says where, in the command's stderr
    if spec.settings_module:
        os.environ["DJANGO_SETTINGS_MODULE"] = spec.settings_module
    import django

    django.setup()
    # Losing locks is this workload's job: their warnings would only bury the progress line.
    logging.getLogger("django_esdlock").setLevel(logging.ERROR)
    from .. import signals
    from ..conf import load_backend
    from .history import HistoryWriter

    history = HistoryWriter(os.path.join(spec.history_dir, f"{process}.jsonl"), process)
    backend = load_backend(spec.config)
    workload = Workload(spec, process, random.Random(f"{spec.seed}/{process}"), history, backend)
    signals.lock_lost.connect(lambda sender, lock, reason, **kw: workload.on_lost(lock, reason), weak=False)
    holding, counters, stop_at, ready = shared["holding"], shared["counters"], shared["stop_at"], shared["ready"]
    clock = ClockSkew(shared["clock"], slot)

    def set_holding(value: int) -> None:
        holding[slot] = value

    def bump(which: int) -> None:
        counters[slot * COUNTERS + which] += 1

    ready[slot] = 1
    waited = time.monotonic() + READY_TIMEOUT
    while stop_at.value == 0 and time.monotonic() < waited:
        time.sleep(0.01)
    try:
        while time.monotonic() < stop_at.value:
            clock.follow()
            workload.run_one(set_holding, bump)
    finally:
        # Not backend.close(): the database backend closes every thread's connection, and
        # SQLite segfaults when that meets a renewal still running on the renewer thread (a
        # renewal that began just before the last release). The process exit closes them.
        workload.close()
        history.close()


_recoveries: dict[str, Callable[..., None]] = {}
"""Run namespace -> what the command does when its reaper recovers one of the run's intents."""


@recovery_handler(INTENT_OP)
def recover(*, intent: Mapping[str, Any], checkpoint: Mapping[str, Any] | None, lock: Any) -> None:
    """Recover a dead workload holder: the command of its run records it (roll forward is a no-op)."""
    sink = _recoveries.get(str(intent.get("run")))
    if sink is not None:
        sink(intent=intent, checkpoint=checkpoint, lock=lock)
