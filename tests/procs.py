"""Run test workers in spawned processes and fail at once, with the worker's traceback, when one dies."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from .peer import SPAWN


class WorkerDied(AssertionError):
    """A worker process raised, or exited without sending its result."""


def _report(conn: Connection, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        result = target(*args)
    except BaseException:  # noqa: BLE001 - every failure goes to the test process
        conn.send(("error", traceback.format_exc()))
    else:
        conn.send(("ok", result))
    finally:
        conn.close()


class Workers:
    """Spawned processes each running ``target(*args)``, whose results or deaths are read from one pipe each."""

    def __init__(self, target: Callable[..., Any], arg_tuples: Sequence[tuple[Any, ...]]) -> None:
        self._started: list[tuple[Any, Connection]] = []
        self._results: dict[int, Any] = {}
        for args in arg_tuples:
            parent, child = SPAWN.Pipe(duplex=False)
            process = SPAWN.Process(target=_report, args=(child, target, args), daemon=True)
            process.start()
            child.close()  # the child's end is its alone now: its death reads as EOF at once
            self._started.append((process, parent))

    def _collect(self, timeout: float) -> None:
        """Read what has arrived within ``timeout`` seconds; raise WorkerDied for a failed or vanished worker."""
        waiting = [conn for i, (_, conn) in enumerate(self._started) if i not in self._results]
        for conn in wait(waiting, timeout=timeout) if waiting else ():
            i = next(i for i, (_, c) in enumerate(self._started) if c is conn)
            process = self._started[i][0]
            try:
                status, value = conn.recv()
            except EOFError:
                process.join(timeout=5)
                raise WorkerDied(f"worker {i} exited with {process.exitcode} before sending a result") from None
            if status == "error":
                raise WorkerDied(f"worker {i} failed:\n{value}")
            self._results[i] = value

    def check(self) -> None:
        """Raise WorkerDied if a worker has failed or exited without a result so far."""
        self._collect(0)

    def results(self, timeout: float) -> list[Any]:
        """Wait at most ``timeout`` seconds for every worker; return what each returned, in order."""
        deadline = time.monotonic() + timeout
        while len(self._results) < len(self._started):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = len(self._started) - len(self._results)
                raise WorkerDied(f"{missing} of {len(self._started)} workers sent nothing for {timeout:g}s")
            self._collect(remaining)
        return [self._results[i] for i in range(len(self._started))]

    def receive(self, channel: Any, what: str, timeout: float) -> Any:
        """Return the next item a worker puts on ``channel`` (a SPAWN queue) within ``timeout`` seconds.

        A worker that died meanwhile fails the call at once; ``what`` says what never came.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            with contextlib.suppress(queue.Empty):
                return channel.get(timeout=0.2)
        raise TimeoutError(f"{what} within {timeout:g}s")

    def close(self) -> None:
        """Join the workers, killing those still running."""
        done = len(self._results) == len(self._started)
        for process, conn in self._started:
            process.join(timeout=10 if done else 0)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
            conn.close()


@contextlib.contextmanager
def spawned(target: Callable[..., Any], arg_tuples: Sequence[tuple[Any, ...]]) -> Iterator[Workers]:
    """Start the workers; on leaving, kill whichever still run."""
    workers = Workers(target, arg_tuples)
    try:
        yield workers
    finally:
        workers.close()


def run_processes(target: Callable[..., Any], arg_tuples: Sequence[tuple[Any, ...]], *, timeout: float) -> list[Any]:
    """Run ``target(*args)`` in one spawned process per ``args``; return their results in order.

    The first worker that raises or exits without a result fails the call at
    once with its traceback (or exit code); the others are killed.
    """
    with spawned(target, arg_tuples) as workers:
        return workers.results(timeout)


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP), as /proc says."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


@contextlib.contextmanager
def frozen(pid: int, timeout: float) -> Iterator[None]:
    """Stop process ``pid`` (SIGSTOP) until the block ends (SIGCONT): a GC pause, a frozen VM, a partition.

    The block starts once the process is stopped (at most ``timeout`` s after the signal).
    """
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + timeout
        while not is_stopped(pid):
            assert time.monotonic() < deadline, f"process {pid} did not stop within {timeout:g}s"
            time.sleep(0.01)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
