"""Measure how long a waiter in another process takes to get a lock after its holder releases it.

Run: ``python -m tests.measure_wakeup [--rounds 300] [--no-notify] [--sqlite]``
(PostgreSQL from ``DATABASE_URL``, default ``postgres://postgres@127.0.0.1:5432/test``;
a fresh database is created and dropped). Each round this process takes
``/wakeup`` exclusively, a waiter process blocks in ``lock_tree("/wakeup",
timeout=None)``, and after a random pause this process releases: the latency
is from the start of the release call to the return of the waiter's acquire
(both read ``time.monotonic()``, one clock for every process on Linux).
``--no-notify`` makes the waiter poll with backoff instead of ``LISTEN``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import random
import statistics
import sys
import time

from .peer import SPAWN, setup_django

WARMUP_ROUNDS = 5


def _waiter(config: dict, notify: bool, conn) -> None:
    setup_django()
    from django_esdlock.conf import load_backend
    from django_esdlock.locks import lock_tree

    backend = load_backend(config)
    if not notify:
        backend.features = dataclasses.replace(backend.features, notifies=False)
    while conn.recv() == "go":
        lock = lock_tree("/wakeup", timeout=None, backend=backend)
        conn.send("waiting")
        lock.acquire()
        granted = time.monotonic()
        lock.release()
        conn.send(granted)
    backend.close()


def measure(config: dict, rounds: int, notify: bool) -> list[float]:
    from django_esdlock.conf import load_backend
    from django_esdlock.locks import lock_tree

    backend = load_backend(config)
    conn, child = SPAWN.Pipe()
    waiter = SPAWN.Process(target=_waiter, args=(config, notify, child), daemon=True)
    waiter.start()
    child.close()  # its death reads as EOF at once
    latencies = []
    try:
        for round_ in range(rounds + WARMUP_ROUNDS):
            lock = lock_tree("/wakeup", backend=backend).acquire()
            conn.send("go")
            assert conn.recv() == "waiting"
            time.sleep(random.uniform(0.05, 0.15))  # the waiter is asleep in wait() by now
            released = time.monotonic()
            lock.release()
            granted = conn.recv()
            if round_ >= WARMUP_ROUNDS:
                latencies.append(granted - released)
        conn.send("stop")
    finally:
        waiter.join(timeout=10)
        backend.close()
    return latencies


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--no-notify", action="store_true", help="make the waiter poll with backoff")
    parser.add_argument("--sqlite", action="store_true", help="measure SQLite (always polls) instead of PostgreSQL")
    args = parser.parse_args(argv)

    setup_django()
    from .dbstores import postgres_store, sqlite_store

    store = sqlite_store() if args.sqlite else postgres_store()
    with store as config:
        latencies = measure(config, args.rounds, notify=not args.no_notify and not args.sqlite)
    ms = [value * 1000 for value in latencies]
    how = "SQLite, backoff" if args.sqlite else "PostgreSQL, " + ("backoff" if args.no_notify else "LISTEN/NOTIFY")
    print(f"release -> grant in another process ({how}), {len(ms)} rounds:")
    print(
        f"  p50 {_percentile(ms, 0.5):.2f} ms   p90 {_percentile(ms, 0.9):.2f} ms   "
        f"p99 {_percentile(ms, 0.99):.2f} ms   max {max(ms):.2f} ms   mean {statistics.fmean(ms):.2f} ms"
    )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
