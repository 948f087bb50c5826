"""Worker processes for the multi-process figures: contention, writer wait, wake-up and deadlock detection latency.

Workers are spawned (not forked) once per run and take one task at a time
over a pipe, so that each figure does not pay for starting Django again.
Times cross process boundaries as ``time.monotonic()`` readings: on Linux
that clock is one clock for every process of the machine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import random
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

SPAWN = multiprocessing.get_context("spawn")

START_TIMEOUT = 120.0


class WorkerError(RuntimeError):
    """A task failed in a worker process; the message carries its traceback."""


# --- tasks (run in the workers) -------------------------------------------------


def contend(backend: Any, conn: Connection, *, paths: list[str], namespace: str, stop_at: float) -> dict[str, Any]:
    """Take X on a random one of ``paths`` and give it back, as fast as possible, until ``stop_at``.

    Return the pairs finished before ``stop_at`` and every wait (time in
    ``acquire()``). A wait still going at ``stop_at`` ends there, counted as
    a wait but not as a pair.
    """
    from ..exceptions import LockTimeout
    from ..locks import lock_tree

    began = time.monotonic()
    pairs, waits = 0, []
    while (started := time.monotonic()) < stop_at:
        lock = lock_tree(random.choice(paths), namespace=namespace, timeout=stop_at - started, backend=backend)
        try:
            lock.acquire()
        except LockTimeout:
            waits.append(time.monotonic() - started)
            break
        waits.append(time.monotonic() - started)
        lock.release()
        if time.monotonic() <= stop_at:
            pairs += 1
    return {"pairs": pairs, "waits": waits, "began": began}


def _hammer(
    acquire: Callable[[], Any], release: Callable[[], Any], stop_at: float, hold: float = 0.0
) -> dict[str, Any]:
    """Acquire (blocking), hold ``hold`` seconds and release one lock, as fast as possible until ``stop_at``;
    pairs and waits."""
    began = time.monotonic()
    pairs, waits = 0, []
    while (started := time.monotonic()) < stop_at:
        acquire()
        waits.append(time.monotonic() - started)
        if hold:
            time.sleep(hold)
        release()
        if time.monotonic() <= stop_at:
            pairs += 1
    return {"pairs": pairs, "waits": waits, "began": began}


def contend_global(backend: Any, conn: Connection, *, hold: float = 0.0) -> dict[str, Any]:
    """Take ``global_lock()`` and give it back, as fast as possible, from "go" till the ``stop_at`` it brings.

    Says "ready" once connected (one pair taken), so that every worker of a
    figure starts at once and none counts its connection setup.
    """
    from ..locks import global_lock

    held: list[Any] = []

    def acquire() -> None:
        held.append(global_lock("bench", backend=backend).acquire())

    def release() -> None:
        held.pop().release()

    acquire()
    release()
    conn.send("ready")
    return _hammer(acquire, release, conn.recv(), hold)


def contend_semaphore(backend: Any, conn: Connection, *, name: str, limit: int, hold: float) -> dict[str, Any]:
    """:func:`contend_global` on a slot of a semaphore of ``limit``; also each hold's (grant, release), monotonic."""
    from ..locks import semaphore

    held: list[Any] = []
    holds: list[tuple[float, float]] = []

    def acquire() -> None:
        held.append(semaphore(name, limit, namespace="bench", backend=backend).acquire())
        holds.append((time.monotonic(), 0.0))

    def release() -> None:
        holds[-1] = (holds[-1][0], time.monotonic())
        held.pop().release()

    acquire()
    release()
    holds.clear()
    conn.send("ready")
    return {**_hammer(acquire, release, conn.recv(), hold), "holds": holds}


def contend_peer(backend: Any, conn: Connection, *, peer: dict[str, str]) -> dict[str, Any]:
    """The same as :func:`contend_global` with a peer's lock (``peers.PeerSpec`` fields)."""
    from .peers import PeerSpec, peer_lock

    with peer_lock(PeerSpec(**peer)) as (acquire, release):
        acquire()
        release()
        conn.send("ready")
        return _hammer(acquire, release, conn.recv())


def churn(backend: Any, conn: Connection, *, paths: list[str], namespace: str, hold: float) -> dict[str, Any]:
    """Take X on random ``paths``, hold each ``hold`` seconds, until told "stop"; report the holds.

    Sends "started" after the first pair, so the caller knows the churn runs.
    A hold lasts from the return of ``acquire()`` to the return of ``release()``.
    """
    from ..locks import lock_tree

    holds: list[float] = []
    while not conn.poll():
        lock = lock_tree(random.choice(paths), namespace=namespace, backend=backend).acquire()
        granted = time.monotonic()
        time.sleep(hold)
        lock.release()
        holds.append(time.monotonic() - granted)
        if len(holds) == 1:
            conn.send("started")
    conn.recv()  # the "stop"
    return {"pairs": len(holds), "longest_hold": max(holds, default=0.0), "holds": holds}


def wake(backend: Any, conn: Connection, *, path: str, namespace: str) -> int:
    """Each round: on "go", say "waiting", block for X on ``path``, send the grant's monotonic time, release.

    Ends on "stop"; returns the number of rounds.
    """
    from ..locks import lock_tree

    rounds = 0
    while conn.recv() == "go":
        lock = lock_tree(path, namespace=namespace, timeout=None, backend=backend)
        conn.send("waiting")
        lock.acquire()
        granted = time.monotonic()
        lock.release()
        conn.send(granted)
        rounds += 1
    return rounds


def hold(backend: Any, conn: Connection, *, path: str, namespace: str) -> int:
    """Each round: on "go", take X on ``path`` and say "held"; on "release", release it and send when that began.

    The time is read just before ``release()``, so that a waiter elsewhere
    measures its wake-up from the start of the release. Ends on "stop";
    returns the number of rounds.
    """
    from ..locks import lock_tree

    rounds = 0
    while conn.recv() == "go":
        lock = lock_tree(path, namespace=namespace, timeout=None, backend=backend).acquire()
        conn.send("held")
        conn.recv()  # "release"
        released = time.monotonic()
        lock.release()
        conn.send(released)
        rounds += 1
    return rounds


def deadlock(backend: Any, conn: Connection, *, namespace: str, deadlock_timeout: float, timeout: float) -> int:
    """Each round: on ``("go", first, second)`` take X on ``first`` and say "held"; on "close" ask for X on ``second``.

    Send ``(outcome, started, ended)``: "deadlock" or "granted", the
    monotonic times just before that request and at its ``LockDeadlock`` or
    grant; then give both back. Looks for deadlocks after
    ``deadlock_timeout`` meanwhile. Ends on "stop"; returns the number of rounds.
    """
    from ..exceptions import LockDeadlock
    from ..locks import lock_tree

    previous, backend.deadlock_timeout = backend.deadlock_timeout, deadlock_timeout
    # Each victim logs a warning naming the cycle: expected here, one a round.
    logger = logging.getLogger("django_esdlock")
    level = logger.level
    logger.setLevel(logging.ERROR)
    rounds = 0
    try:
        while (message := conn.recv()) != "stop":
            _, first, second = message
            outer = lock_tree(first, namespace=namespace, timeout=timeout, backend=backend).acquire()
            try:
                conn.send("held")
                conn.recv()  # "close": the other worker holds its path too
                inner = lock_tree(second, namespace=namespace, timeout=timeout, backend=backend)
                started = time.monotonic()
                try:
                    inner.acquire()
                except LockDeadlock:
                    outcome, ended = "deadlock", time.monotonic()
                else:
                    outcome, ended = "granted", time.monotonic()
                    inner.release()
            finally:
                outer.release()
            conn.send((outcome, started, ended))
            rounds += 1
    finally:
        backend.deadlock_timeout = previous
        logger.setLevel(level)
    return rounds


TASKS: dict[str, Callable[..., Any]] = {
    "contend": contend,
    "contend_global": contend_global,
    "contend_semaphore": contend_semaphore,
    "contend_peer": contend_peer,
    "churn": churn,
    "wake": wake,
    "hold": hold,
    "deadlock": deadlock,
}


def _serve(settings_module: str, conn: Connection) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    import django

    django.setup()
    from ..conf import load_backend

    backends: dict[str, Any] = {}
    conn.send("ready")
    try:
        while True:
            message = conn.recv()
            if message[0] == "quit":
                return
            if message[0] == "ping":
                conn.send(time.monotonic())
                continue
            if message[0] == "forget":
                backend = backends.pop(json.dumps(message[1], sort_keys=True), None)
                if backend is not None:
                    backend.close()
                conn.send("forgotten")
                continue
            _, task, config, kwargs = message
            key = json.dumps(config, sort_keys=True)
            if key not in backends:
                backends[key] = load_backend(config)
            try:
                conn.send(("done", TASKS[task](backends[key], conn, **kwargs)))
            except Exception:  # noqa: BLE001 - reported to the parent, which raises it
                conn.send(("error", traceback.format_exc()))
    finally:
        for backend in backends.values():
            with contextlib.suppress(Exception):
                backend.close()


class WorkerPool:
    """``size`` spawned processes running tasks of :data:`TASKS` against lock configs.

    The children set Django up from ``settings_module`` (the parent's
    ``DJANGO_SETTINGS_MODULE``); they inherit ``sys.path`` through spawn.
    """

    def __init__(self, size: int, settings_module: str) -> None:
        self.conns: list[Connection] = []
        self.processes: list[Any] = []
        self._busy: set[int] = set()
        for _ in range(size):
            parent, child = SPAWN.Pipe()
            process = SPAWN.Process(target=_serve, args=(settings_module, child), daemon=True)
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)
        # Wait for Django in every worker: a timed task must not pay for it.
        for conn in self.conns:
            if self.receive(conn) != "ready":
                raise WorkerError("a worker did not start")

    def wake_floor(self, rounds: int) -> float:
        """Return the median time an idle worker takes to see a message: a floor under every wake-up figure.

        Each round sleeps 20 ms first, so the worker (and the CPU it ran on) is idle when the message comes.
        """
        conn = self.conns[0]
        delays = []
        for _ in range(rounds):
            time.sleep(0.02)
            sent = time.monotonic()
            conn.send(("ping",))
            delays.append(self.receive(conn) - sent)
        return sorted(delays)[len(delays) // 2]

    def start(self, task: str, config: dict[str, Any], count: int, **kwargs: Any) -> list[Connection]:
        """Start ``task`` on the first ``count`` workers; return their pipes (for the task's own messages)."""
        if count > len(self.conns):
            raise ValueError(f"the pool has {len(self.conns)} workers, not {count}")
        conns = self.conns[:count]
        for conn in conns:
            self._settle(conn)
            conn.send(("run", task, config, kwargs))
            self._busy.add(id(conn))
        return conns

    def _settle(self, conn: Connection) -> None:
        """Wait out a task a failed figure left running, dropping what it still sends."""
        while id(conn) in self._busy:
            with contextlib.suppress(WorkerError):
                message = self.receive(conn)
                if not (isinstance(message, tuple) and message[0] == "done"):
                    continue
            self._busy.discard(id(conn))

    @staticmethod
    def receive(conn: Connection, timeout: float = START_TIMEOUT) -> Any:
        """Return the next message of a task; raise WorkerError if the task failed or stays silent."""
        try:
            if not conn.poll(timeout):
                raise WorkerError(f"a worker sent nothing for {timeout:g}s")
            message = conn.recv()
        except EOFError as e:
            raise WorkerError("a worker process exited") from e
        if isinstance(message, tuple) and message and message[0] == "error":
            raise WorkerError(message[1])
        return message

    def results(self, conns: list[Connection], timeout: float = START_TIMEOUT) -> list[Any]:
        """Wait for the task on each of ``conns`` to finish; return what each returned."""
        values = []
        for conn in conns:
            try:
                message = self.receive(conn, timeout)
            except WorkerError:
                self._busy.discard(id(conn))  # the task ended, in failure
                raise
            if not (isinstance(message, tuple) and message[0] == "done"):
                raise WorkerError(f"a worker sent {message!r} where its result was due")
            self._busy.discard(id(conn))
            values.append(message[1])
        return values

    def run_together(self, task: str, config: dict[str, Any], count: int, seconds: float, **kwargs: Any) -> list[Any]:
        """Run ``task`` on ``count`` workers that say "ready", then start them together for ``seconds``."""
        conns = self.start(task, config, count, **kwargs)
        for conn in conns:
            if self.receive(conn) != "ready":
                raise WorkerError(f"a {task} worker did not get ready")
        stop_at = time.monotonic() + seconds
        for conn in conns:
            conn.send(stop_at)
        return [{**result, "stop_at": stop_at} for result in self.results(conns)]

    def run_each(self, task: str, config: dict[str, Any], kwargs_list: list[dict[str, Any]]) -> list[Any]:
        """Run ``task`` on one worker per entry of ``kwargs_list`` at once, each with its own arguments."""
        if len(kwargs_list) > len(self.conns):
            raise ValueError(f"the pool has {len(self.conns)} workers, not {len(kwargs_list)}")
        conns = self.conns[: len(kwargs_list)]
        for conn, kwargs in zip(conns, kwargs_list, strict=True):
            self._settle(conn)
            conn.send(("run", task, config, kwargs))
            self._busy.add(id(conn))
        return self.results(conns)

    def run(self, task: str, config: dict[str, Any], count: int, **kwargs: Any) -> list[Any]:
        """Run ``task`` on ``count`` workers at once and return their results."""
        return self.results(self.start(task, config, count, **kwargs))

    def forget(self, config: dict[str, Any]) -> None:
        """Make every worker close its backend of ``config``, before the store goes away under it."""
        for conn in self.conns:
            self._settle(conn)
            conn.send(("forget", config))
        for conn in self.conns:
            self.receive(conn)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("quit",))
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
