"""The nemesis: pauses (SIGSTOP past the lease, then SIGCONT), kills (SIGKILL mid-hold), store cuts, black holes,
slow links, skewed wall clocks, store restarts, store failovers and node failovers."""

from __future__ import annotations

import functools
import os
import random
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from .checker import FAULT_SPANS

FAULTS = ("pause", "kill", "store", "blackhole", "latency", "clock", "store-restart", "store-failover", "failover")
"""Every fault, in the order a run injects them (each in turn, one at a time)."""

PROXY_FAULTS = ("store", "blackhole", "latency")
"""The faults of the loopback proxy between the workers and a store reached over TCP."""

LATENCY = (0.02, 0.4)
"""Seconds the latency fault delays each chunk of bytes, either way: drawn from this range for each."""

CLOCK_OFFSET_MINUTES = (1.0, 10.0)
"""How far the clock fault sets a worker's wall clock off, either way (signs alternate from worker to worker)."""

STORE_COMMAND_TIMEOUT = 120.0
"""Seconds a ``--store-restart`` or ``--store-failover`` command may take before it counts as failed (and is killed)."""


class Nemesis:
    """Injects the enabled faults in turn, at random moments, until the run's stop time.

    ``pids()`` gives the current pid of each worker slot and ``holding()``
    what each slot holds (0 nothing, 1 a lock, 2 a lock with an intent);
    ``respawn(slot)`` replaces a killed worker. A fault method that returns
    False injected nothing this turn (a failover while the last killed node is
    not back yet).
    """

    def __init__(
        self,
        faults: Sequence[str],
        *,
        ttl: float,
        rng: random.Random,
        record: Callable[..., Any],
        workers: Any,
        proxy: Any | None,
        failover: Any | None = None,
        store_restart: str | None = None,
        store_failover: str | None = None,
    ) -> None:
        self.faults = list(faults)
        self.ttl = ttl
        self.rng = rng
        self.record = record
        self.workers = workers
        self.proxy = proxy
        self.failover_driver = failover
        self.commands = {"store-restart": store_restart, "store-failover": store_failover}
        self.injected = dict.fromkeys(FAULTS, 0)
        self._kills = 0
        self._clock_sign = 1

    def run(self, stop_at: float, stopping: Callable[[], bool]) -> None:
        if not self.faults:
            return
        self._sleep(self.rng.uniform(0.2, 0.5) * self.ttl, stopping)
        turn = 0
        while not stopping() and time.monotonic() < stop_at - 0.3:
            fault = self.faults[turn % len(self.faults)]
            if getattr(self, fault.replace("-", "_"))(stopping) is not False:
                self.injected[fault] += 1
            turn += 1
            self._sleep(self.rng.uniform(0.3, 1.0) * self.ttl, stopping)

    def _sleep(self, seconds: float, stopping: Callable[[], bool]) -> None:
        end = time.monotonic() + seconds
        while not stopping() and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def _victim(self, want: int | None = None, within: float = 1.0) -> int:
        """Return a slot that holds a lock (with an intent if ``want`` is 2), waiting up to ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            holding = self.workers.holding()
            slots = [i for i, h in enumerate(holding) if (h == want if want else h > 0)]
            if slots:
                return self.rng.choice(slots)
            if time.monotonic() >= deadline:
                return self.rng.randrange(len(holding))
            time.sleep(0.005)

    def pause(self, stopping: Callable[[], bool]) -> None:
        """SIGSTOP a holder for longer than its lease, then SIGCONT it (a GC pause)."""
        slot = self._victim()
        process, pid = self.workers.process(slot)
        seconds = self.ttl * 1.5 + 0.3
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return  # it ended meanwhile (the run is over)
        self.record("pause", victim=process, pid=pid, seconds=seconds, holding=self.workers.holding()[slot])
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
            self.record("resume", victim=process, pid=pid)

    def kill(self, stopping: Callable[[], bool]) -> None:
        """SIGKILL a holder mid-hold, every other time one that holds an intent; start a new worker in its place."""
        self._kills += 1
        slot = self._victim(2 if self._kills % 2 == 0 else 1)
        process, pid = self.workers.process(slot)
        holding = self.workers.holding()[slot]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.record("kill", victim=process, pid=pid, holding=holding)
        self.workers.respawn(slot)

    def store(self, stopping: Callable[[], bool]) -> None:
        """Cut every connection to the store for about a lease, then restore it."""
        seconds = self.rng.uniform(0.5, 1.5) * self.ttl
        self._for_a_while(seconds, self.proxy.cut, self.proxy.restore, ("cut", "restore"))

    def _for_a_while(
        self, seconds: float, start: Callable[[], Any], stop: Callable[[], Any], events: tuple[str, str], **fields: Any
    ) -> None:
        """Start a fault, record its begin event, wait ``seconds``, stop it and record its end, whatever happens."""
        start()
        self.record(events[0], seconds=seconds, **fields)
        try:
            self._sleep(seconds, lambda: False)
        finally:
            stop()
            self.record(events[1])

    def blackhole(self, stopping: Callable[[], bool]) -> None:
        """Stop forwarding, both ways, for longer than a lease, every socket kept open; then forward again.

        Unlike a cut, nobody is told: a call in flight waits for an answer that
        does not come, as behind a dropped link or a hung peer.
        """
        seconds = self.ttl * self.rng.uniform(1.2, 1.8)
        self._for_a_while(seconds, self.proxy.black_hole, self.proxy.resume, ("blackhole", "flow"))

    def latency(self, stopping: Callable[[], bool]) -> None:
        """Delay every chunk of bytes, either way, by 20-400 ms (each drawn anew) for one to two leases."""
        seconds = self.ttl * self.rng.uniform(1.0, 2.0)
        slow = functools.partial(self.proxy.slow, *LATENCY)
        self._for_a_while(seconds, slow, self.proxy.fast, ("latency", "latency_end"), low=LATENCY[0], high=LATENCY[1])

    def clock(self, stopping: Callable[[], bool]) -> None:
        """Set every worker's wall clock off by minutes, signs alternating, for one to two leases; then right again.

        Only the wall clock (``time.time``, ``datetime.now``): the monotonic
        clock runs on, as under NTP skew. See ``workload.ClockSkew``.
        """
        seconds = self.ttl * self.rng.uniform(1.0, 2.0)
        slots = len(self.workers.holding())
        offsets = []
        for slot in range(slots):
            sign = self._clock_sign if slot % 2 == 0 else -self._clock_sign
            offsets.append(round(sign * 60 * self.rng.uniform(*CLOCK_OFFSET_MINUTES), 3))
        self._clock_sign = -self._clock_sign

        def skew() -> None:
            for slot, offset in enumerate(offsets):
                self.workers.set_clock(slot, offset)

        def right() -> None:
            for slot in range(slots):
                self.workers.set_clock(slot, 0.0)

        self._for_a_while(seconds, skew, right, ("clock", "clock_end"), offsets=offsets)

    def store_restart(self, stopping: Callable[[], bool]) -> None:
        """Run ``--store-restart CMD`` (e.g. ``pg_ctl restart -m immediate``): the store goes down and comes back."""
        self._store_command("store-restart")

    def store_failover(self, stopping: Callable[[], bool]) -> None:
        """Run ``--store-failover CMD``: the store's primary dies and a standby is promoted in its place."""
        self._store_command("store-failover")

    def _store_command(self, fault: str) -> None:
        """Run the user's command of ``fault`` between its begin and end events; its failure is recorded, not raised."""
        command = self.commands[fault]
        begin, end = FAULT_SPANS[fault]
        self.record(begin, command=command)
        try:
            done = subprocess.run(
                command, shell=True, capture_output=True, text=True, timeout=STORE_COMMAND_TIMEOUT, check=False
            )
            exitcode, output = done.returncode, (done.stdout + done.stderr).strip()[-500:]
        except subprocess.TimeoutExpired:
            exitcode, output = None, f"still running after {STORE_COMMAND_TIMEOUT:g}s: {shlex.quote(command)}"
        self.record(end, exitcode=exitcode, output=output if exitcode != 0 else "")

    def failover(self, stopping: Callable[[], bool]) -> bool:
        """SIGKILL the node of the lock index's primary, or the master, in turn; restart it in the background."""
        from .failover import failover_errors

        try:
            return self.failover_driver.inject()
        except failover_errors() as e:  # a kill command that failed, a cluster that did not answer: say so, go on
            self.record("failover_error", error=f"{type(e).__name__}: {e}")
            return False
