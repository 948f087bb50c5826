"""A worker process that dies fails its test at once, with its traceback: no test sits out a timeout."""

from __future__ import annotations

import os
import time

import pytest

from .peer import Peer
from .procs import WorkerDied, run_processes, spawned
from .stores import es_config

PATIENCE = 120.0
"""The timeout given: a dead worker must be noticed long before it."""


def _square(x: int) -> int:
    return x * x


def _raise(message: str) -> None:
    raise RuntimeError(message)


def _exit_hard(code: int) -> None:
    os._exit(code)


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_results_come_back_in_order():
    assert run_processes(_square, [(1,), (2,), (3,)], timeout=PATIENCE) == [1, 4, 9]


def _still_running(workers) -> bool:
    return all(process.is_alive() for process, _ in workers._started)


def test_a_worker_that_raises_fails_the_call_with_its_traceback():
    # Its traceback, not the patience running out (that would say "sent nothing for 120s").
    with pytest.raises(WorkerDied, match=r"(?s)worker 0 failed:.*RuntimeError: the environment broke"):
        run_processes(_raise, [("the environment broke",)], timeout=PATIENCE)


def test_a_worker_that_exits_without_a_result_fails_the_call_at_once():
    # The sleeper sleeps half the patience: a death read only when the patience ran out (the sleeper's own
    # clock starts after the call's, once its interpreter is up) would find it gone.
    with spawned(_sleep, [(PATIENCE / 2,)]) as sleepers, spawned(_exit_hard, [(3,)]) as dying:
        with pytest.raises(WorkerDied, match="exited with 3"):
            dying.results(timeout=PATIENCE)
        # Reported while that sleeper still runs: at once, not at the timeout.
        sleepers.check()
        assert _still_running(sleepers), "the death was reported only after the patience ran out"


def test_a_dead_peer_fails_its_next_call_at_once():
    peer = Peer(es_config("http://127.0.0.1:9"))
    try:
        assert peer.pid() > 0
        peer.process.kill()
        peer.process.join(timeout=10)
        # Its death, not its silence: a call that waited out its timeout would raise TimeoutError instead.
        with pytest.raises(AssertionError, match="peer exited with -9"):
            peer.pid()
    finally:
        peer.close()
