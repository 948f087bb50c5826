"""Many processes doing read-modify-writes that only the lock protects, and a checker."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time

from .peer import SPAWN, setup_django
from .procs import run_processes

# A small tree: locking an inner node covers every leaf below it.
TREE = ["/r", "/r/a", "/r/b", "/r/a/x", "/r/a/y", "/r/b/z", "/r/b/w"]
LEAVES = [p for p in TREE if not any(q.startswith(p + "/") for q in TREE)]


def leaves_under(path: str) -> list[int]:
    return [i for i, leaf in enumerate(LEAVES) if leaf == path or leaf.startswith(path + "/")]


def _worker(config, counters, last_tokens, violations, rounds, seed, use_locks, start) -> list[int]:
    setup_django()
    from django_esdlock import lock_tree
    from django_esdlock.conf import load_backend

    backend = load_backend(config)
    rng = random.Random(seed)
    start.wait(timeout=120)  # all together: on a busy machine the first would finish before the last started
    tally = [0] * len(LEAVES)
    for _ in range(rounds):
        path = rng.choice(TREE)
        targets = leaves_under(path)
        guard = lock_tree(path, namespace="stress", backend=backend) if use_locks else contextlib.nullcontext()
        with guard as lock:
            values = [counters[i] for i in targets]
            time.sleep(rng.uniform(0, 0.002))  # widen the window a lost update needs
            for i, value in zip(targets, values, strict=True):
                counters[i] = value + 1
                if lock is not None:
                    # Fencing: every later writer of a leaf must carry a larger token.
                    if lock.token <= last_tokens[i]:
                        violations.value += 1
                    last_tokens[i] = lock.token
        for i in targets:
            tally[i] += 1
    backend.close()
    return tally


@dataclasses.dataclass
class StressResult:
    expected: list[int]
    actual: list[int]
    token_violations: int
    seconds: float

    @property
    def lost_updates(self) -> int:
        return sum(self.expected) - sum(self.actual)


def run_stress(config: dict, *, processes: int = 8, rounds: int = 250, use_locks: bool = True) -> StressResult:
    """Run ``processes`` workers of ``rounds`` acquisitions each; return what the checker saw."""
    counters = SPAWN.Array("q", len(LEAVES), lock=False)
    last_tokens = SPAWN.Array("q", len(LEAVES), lock=False)
    violations = SPAWN.Value("q", 0, lock=False)
    start = SPAWN.Barrier(processes)
    started = time.monotonic()
    tallies = run_processes(
        _worker,
        [(config, counters, last_tokens, violations, rounds, seed, use_locks, start) for seed in range(processes)],
        timeout=600,
    )
    expected = [sum(column) for column in zip(*tallies, strict=True)]
    return StressResult(expected, list(counters), violations.value, time.monotonic() - started)
