"""One lock_check run: start the store proxy and the workers, inject faults, reap, and check the history."""

from __future__ import annotations

import contextlib
import datetime
import functools
import importlib.util
import multiprocessing
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..conf import backend_config, load_backend
from ..exceptions import LockError
from ..records import Kind, Node
from .checker import check_history
from .failover import Failover, FailoverCommands, failover_errors
from .faults import PROXY_FAULTS, Nemesis
from .guarded import GuardedStore
from .history import HistoryWriter, read_events, write_history
from .options import CheckOptions
from .proxy import Proxies
from .report import CheckResult
from .workload import COUNTERS, WorkloadSpec, _recoveries, guarded_keys, node_list, worker_main


def _context() -> Any:
    """Forkserver (workers forked from a server that set Django up once), else spawn.

    Never plain fork: the command runs threads (proxy, reaper, nemesis).
    """
    try:
        context = multiprocessing.get_context("forkserver")
    except ValueError:
        return multiprocessing.get_context("spawn")
    context.set_forkserver_preload(["django_esdlock.checker.preload"])
    return context


START_TIMEOUT = 120.0
"""Seconds the workers may take to start (spawn, Django setup, first connection)."""


# --- the store proxy ----------------------------------------------------------


def _failover(
    config: dict[str, Any], backend: Any, namespace: str, options: CheckOptions, record: Callable[..., Any]
) -> tuple[Failover | None, str]:
    """Return the failover fault's driver for this store, or None and why it cannot apply."""
    if not backend.features.fails_over:
        return None, f"{type(backend).__name__} is not a cluster of nodes that fails over"
    commands = FailoverCommands(restart=options.failover_restart, kill=options.failover_kill)
    failover = Failover(backend, backend.index_of(namespace), commands, record)
    try:
        why = failover.applicable()
    except failover_errors() as e:  # the cluster did not say which nodes it has
        return None, f"could not list the cluster's nodes: {type(e).__name__}: {e}"
    return (None, why) if why else (failover, "")


# --- the worker processes ---------------------------------------------------------


class Workers:
    """The N worker processes, one per slot; a killed one is replaced by a new process in its slot."""

    def __init__(self, spec: WorkloadSpec, n: int, record: Callable[..., Any]) -> None:
        self.spec = spec
        self.record = record
        self.context = _context()
        self.shared = {
            "holding": self.context.Array("i", n, lock=False),
            "ready": self.context.Array("i", n, lock=False),
            "counters": self.context.Array("q", n * COUNTERS, lock=False),
            "stop_at": self.context.Value("d", 0.0, lock=False),
            "clock": self.context.Array("d", n, lock=False),
        }
        self.generation = [0] * n
        self.slots: list[tuple[str, Any]] = []
        self.retired: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        for slot in range(n):
            self.slots.append(self._start(slot))

    def _start(self, slot: int) -> tuple[str, Any]:
        gen = self.generation[slot]
        name = f"w{slot}" if gen == 0 else f"w{slot}.{gen}"
        process = self.context.Process(
            target=worker_main, args=(self.spec, slot, name, self.shared), name=f"lock-check-{name}", daemon=True
        )
        process.start()
        self.record("spawn", victim=name, pid=process.pid)
        return name, process

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(self.shared["ready"]):
            for name, process in self.slots:
                if not process.is_alive():
                    raise RuntimeError(f"worker {name} exited with {process.exitcode} while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not start within {timeout:g}s")
            time.sleep(0.02)

    def go(self, stop_at: float) -> None:
        self.shared["stop_at"].value = stop_at

    def holding(self) -> list[int]:
        return list(self.shared["holding"])

    def set_clock(self, slot: int, offset: float) -> None:
        """Set the wall clock of the worker in ``slot`` (and of its replacements) ``offset`` seconds off."""
        self.shared["clock"][slot] = offset

    def counters(self) -> list[int]:
        values = list(self.shared["counters"])
        return [sum(values[i::COUNTERS]) for i in range(COUNTERS)]

    def process(self, slot: int) -> tuple[str, int]:
        with self._lock:
            name, process = self.slots[slot]
            return name, process.pid

    def respawn(self, slot: int) -> None:
        with self._lock:
            name, process = self.slots[slot]
            process.join(timeout=5)
            self.retired.append((name, process))
            self.shared["holding"][slot] = 0
            self.generation[slot] += 1
            self.slots[slot] = self._start(slot)

    def join(self, deadline: float) -> None:
        """Wait for every worker until ``deadline``; kill (and record as hung) those still running."""
        for name, process in self.slots:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                process.kill()
                process.join(timeout=10)
                self.record("exit", victim=name, pid=process.pid, how="hung")
            elif process.exitcode != 0:
                self.record("exit", victim=name, pid=process.pid, how="crashed", exitcode=process.exitcode)
            else:
                self.record("exit", victim=name, pid=process.pid, how="done")

    def kill_all(self) -> None:
        for _, process in self.slots:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                process.kill()
                process.join(timeout=10)


# --- the run ------------------------------------------------------------------------


class _Reaping(threading.Thread):
    """The command's reaper: recovers the run's dead holders with intents while the workload runs."""

    def __init__(self, backend: Any, namespace: str, every: float, record: Callable[..., Any]) -> None:
        super().__init__(name="lock-check-reaper", daemon=True)
        self.backend = backend
        self.namespace = namespace
        self.every = every
        self.record = record
        self.stop = threading.Event()
        self.started_at = 0.0

    def reap(self) -> None:
        from ..reaper import Reaper

        self.started_at = time.monotonic()
        Reaper(self.backend, namespace=self.namespace).run()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self.reap()
            except LockError as e:  # the store is cut, say: the next pass tries again
                self.record("reap_failed", process="reaper", error=str(e))


def run_check(
    config: Any = None,
    options: CheckOptions | None = None,
    *,
    progress: Callable[[dict[str, Any]], None] | None = None,
    history: str | os.PathLike[str] | None = None,
) -> CheckResult:
    """Run the workload against the store of ``config`` (a LOCK_BACKEND value; default the setting) and check it.

    Locks are taken in a fresh namespace ``lock-check-<hex>`` and one global
    lock of that name: nothing else of the store is read or changed.
    """
    options = options or CheckOptions()
    config = backend_config(config)
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    namespace = f"lock-check-{uuid.uuid4().hex[:10]}"
    backend = load_backend(config)
    backend.setup()  # before the workers: N processes creating the tables or index on first use would race
    started = time.monotonic()
    skipped: dict[str, str] = {}
    proxy: Proxies | None = None
    worker_config = config
    proxied = [f for f in PROXY_FAULTS if f in options.faults]
    if proxied:
        targets, why = backend.endpoints()
        if not targets:
            skipped.update(dict.fromkeys(proxied, why))
        else:
            proxy = Proxies(targets)
            worker_config = {**config, "OPTIONS": backend.options_through(config["OPTIONS"], proxy.ports)}
    if "clock" in options.faults and importlib.util.find_spec("time_machine") is None:
        skipped["clock"] = "needs time-machine, which moves a process's wall clock alone: pip install time-machine"
    if "store-restart" in options.faults and not options.store_restart:
        skipped["store-restart"] = "needs --store-restart CMD, the command that restarts the store"
    if "store-failover" in options.faults and not options.store_failover:
        skipped["store-failover"] = "needs --store-failover CMD, the command that kills the primary, promotes a standby"
    directory = tempfile.mkdtemp(prefix="lock-check-")
    writer = HistoryWriter(Path(directory) / "command.jsonl", "command")
    nemesis_record = functools.partial(writer.record, process="nemesis")
    failover: Failover | None = None
    if "failover" in options.faults:
        failover, why = _failover(config, backend, namespace, options, nemesis_record)
        if failover is None:
            skipped["failover"] = why
    faults = [f for f in options.faults if f not in skipped]
    guarded = None
    if options.guarded is not None:
        guarded = GuardedStore.for_backend(backend, options.guarded)
        guarded_data = guarded.open()
    spec = WorkloadSpec(
        config=worker_config,
        namespace=namespace,
        global_name=namespace,
        ttl=options.ttl,
        max_hold=options.max_hold,
        max_timeout=options.max_timeout,
        history_dir=directory,
        settings_module=os.environ.get("DJANGO_SETTINGS_MODULE"),
        seed=seed,
        guarded=guarded,
        semaphores=options.semaphores,
    )
    reaping = _Reaping(backend, namespace, max(options.ttl, 0.5), writer.record)
    _recoveries[namespace] = _recorder(writer, reaping)
    workers: Workers | None = None
    try:
        if guarded is not None:  # inside the try: a run that fails from here on drops what it created
            guarded_data.create(guarded_keys(namespace))
        workers = Workers(spec, options.processes, writer.record)
        workers.wait_ready(START_TIMEOUT)
        stop_at = time.monotonic() + options.seconds
        writer.record("start", namespace=namespace, seed=seed, process="command")
        workers.go(stop_at)
        reaping.start()
        nemesis = Nemesis(
            faults,
            ttl=options.ttl,
            rng=rng,
            record=nemesis_record,
            workers=workers,
            proxy=proxy,
            failover=failover,
            store_restart=options.store_restart,
            store_failover=options.store_failover,
        )
        done = threading.Event()
        thread = threading.Thread(target=nemesis.run, args=(stop_at, done.is_set), name="lock-check-nemesis")
        thread.start()
        while time.monotonic() < stop_at:
            if progress:
                progress(_progress(stop_at, options, workers, nemesis))
            time.sleep(min(0.5, max(0.01, stop_at - time.monotonic())))
        if progress:
            progress(_progress(stop_at, options, workers, nemesis))
        done.set()
        thread.join(timeout=options.ttl * 2 + 10)
        writer.record("stop", process="command")
        workers.join(stop_at + options.max_timeout + options.max_hold + options.slack + options.ttl)
        reaping.stop.set()
        reaping.join(timeout=60)
        if proxy is not None:
            proxy.restore()
            proxy.resume()
            proxy.fast()
        if failover is not None:
            failover.settle()  # the last killed node back before the final reap, and the cluster whole
        _final_reap(backend, spec, reaping, writer, options)
        if guarded is not None:
            for key, ops in guarded_data.all().items():
                writer.record("data", key=key, ops=ops, process="command")
    finally:
        if guarded is not None:
            with contextlib.suppress(Exception):
                guarded_data.drop()
        if workers is not None:
            workers.kill_all()
        if failover is not None:
            failover.settle()  # never leave a node of the user's cluster down
        _recoveries.pop(namespace, None)
        if proxy is not None:
            proxy.close()
        writer.close()
        events = read_events(sorted(Path(directory).glob("*.jsonl")))
        shutil.rmtree(directory, ignore_errors=True)
        backend.close()
    if history is not None:
        write_history(events, history)
    violations = check_history(events, slack=options.slack)
    result = CheckResult(
        backend=backend.describe(),
        namespace=namespace,
        global_name=namespace,
        seed=seed,
        options=options,
        skipped=skipped,
        events=events,
        violations=violations,
        seconds=time.monotonic() - started,
    )
    if progress:
        progress({"done": True})
    return result


def _progress(stop_at: float, options: CheckOptions, workers: Workers, nemesis: Nemesis) -> dict:
    operations, grants, lost = workers.counters()
    now = time.monotonic()
    return {
        "elapsed": min(options.seconds, max(0.0, options.seconds - (stop_at - now))),
        "seconds": options.seconds,
        "operations": operations,
        "grants": grants,
        "lost": lost,
        "faults": sum(nemesis.injected.values()),
    }


def _recorder(writer: HistoryWriter, reaping: _Reaping) -> Callable[..., None]:
    """Return what the recovery handler does for this run: record the takeover as a grant, and the recovery."""
    count = [0]

    def recovered(*, intent: Any, checkpoint: Any, lock: Any) -> None:
        count[0] += 1
        op = f"reaper-{count[0]}"
        nodes = node_list(lock.targets)
        record = writer.record
        # The takeover was asked for after this reaper pass began: that is its invocation.
        record("invoke", op=op, process="reaper", kind="recovery", nodes=nodes, timeout=None, intent=dict(intent),
               recovery=True, t=reaping.started_at)  # fmt: skip
        record("ok", op=op, process="reaper", holder=lock.holder_id, token=lock.token)
        t = time.monotonic()
        record("write", op=op, process="reaper", token=lock.token, valid=not lock.lost, t=t)
        record("recovered", process="reaper", intent_op=intent.get("op_id"), holder=lock.holder_id,
               token=lock.token, checkpoint=checkpoint, nodes=nodes)  # fmt: skip
        t = time.monotonic()
        record("release", op=op, process="reaper", valid=not lock.lost, t=t)

    return recovered


def _final_reap(
    backend: Any, spec: WorkloadSpec, reaping: _Reaping, writer: HistoryWriter, options: CheckOptions
) -> None:
    """Let every lease run out, reap, free the global lock's expired holder; record what is still held."""
    from ..locks import global_lock

    # The command's own connection may have died with the store (a store restart): its first call fails, the
    # next opens a new one.
    held = _tried(lambda: _held(backend, spec), pause=options.ttl)
    if held:  # killed, lost or hung holders: leases run out first
        time.sleep(_until_expired(held, options.ttl, backend.ttl))
    try:
        _tried(reaping.reap, pause=options.ttl)
    except LockError as e:
        writer.record("reap_failed", process="command", error=str(e))
        time.sleep(options.ttl)
    # The global lock lives in namespace "default": evict its expired holder by taking it, never by reaping others'.
    if backend.node_holders(Node("default", Kind.GLOBAL, spec.global_name)):
        with contextlib.suppress(LockError):
            lock = global_lock(spec.global_name, timeout=options.ttl * 2 + 1, ttl=options.ttl, backend=backend)
            lock.acquire().release()
    for record in _held(backend, spec):
        _leftover(writer, record)


def _until_expired(records: list[Any], ttl: float, backend_ttl: float) -> float:
    """Seconds to wait for every lease of ``records`` to end, a little over; at least the run's lease ``ttl``.

    A recovery by the command's reaper holds for the backend's lease, not the run's: one whose release the
    store failed (a failover at that moment) holds until that lease ends. Never longer than the longest lease.
    """
    now = datetime.datetime.now(datetime.UTC)
    left = max((r.expires_at - now).total_seconds() for r in records)
    return min(max(ttl, left), max(ttl, backend_ttl)) + 0.2


def _tried(call: Callable[[], Any], *, pause: float, tries: int = 3) -> Any:
    """Return what ``call`` returns, calling it again after ``pause`` seconds while it raises LockError, at most
    ``tries`` times in all; the last error is raised."""
    for attempt in range(tries):
        try:
            return call()
        except LockError:
            if attempt == tries - 1:
                raise
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def _held(backend: Any, spec: WorkloadSpec) -> list[Any]:
    """Every holder record of the run: its namespace and its global lock."""
    records = []
    cursor = None
    while True:
        page = backend.holders(namespace=spec.namespace, cursor=cursor, limit=500)
        records.extend(page.holders)
        cursor = page.next_cursor
        if cursor is None:
            break
    return records + backend.node_holders(Node("default", Kind.GLOBAL, spec.global_name))


def _leftover(writer: HistoryWriter, record: Any) -> None:
    writer.record(
        "leftover",
        process="command",
        holder=record.holder_id,
        node=str(record.node),
        mode=record.mode.value,
        token=record.token,
        expires_at=record.expires_at.isoformat(),
        intent=record.intent,
    )
