"""The locks users would otherwise pick, measured beside ours (``lock_bench --peers``).

Each peer is an optional package (``pip install 'django-esdlock[bench]'``) and
a store; a peer whose package is missing or whose store does not answer is
skipped with a line saying why, never fatal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

REDIS_URL = "redis://127.0.0.1:6379/0"
LOCK_NAME = "esdlock-bench"


@dataclasses.dataclass(frozen=True)
class PeerSpec:
    """How to reach one peer lock: its kind and its store's URL (plain data, sent to worker processes)."""

    key: str
    label: str
    url: str


def tooz_postgres(database_url: str) -> PeerSpec:
    """tooz's PostgreSQL driver (session advisory locks) on the run's throwaway database."""
    return PeerSpec("tooz_pg", "tooz PostgreSQL driver", database_url.replace("postgres://", "postgresql://", 1))


def redis_lock(url: str | None = None) -> PeerSpec:
    """python-redis-lock on a local Redis (``REDIS_URL`` or 127.0.0.1:6379)."""
    return PeerSpec("redis_lock", "python-redis-lock (Redis)", url or os.environ.get("REDIS_URL", REDIS_URL))


@contextlib.contextmanager
def peer_lock(spec: PeerSpec) -> Iterator[tuple[Callable[[], Any], Callable[[], Any]]]:
    """Yield (acquire, release) of one blocking lock of ``spec``, on a connection of its own."""
    if spec.key == "tooz_pg":
        from tooz import coordination

        coordinator = coordination.get_coordinator(spec.url, os.urandom(8).hex().encode())
        coordinator.start()
        try:
            lock = coordinator.get_lock(LOCK_NAME.encode())
            yield (lambda: lock.acquire(blocking=True)), lock.release
        finally:
            coordinator.stop()
    elif spec.key == "redis_lock":
        import redis
        import redis_lock as redis_lock_module

        client = redis.Redis.from_url(spec.url)
        try:
            lock = redis_lock_module.Lock(client, LOCK_NAME, expire=30)

            def acquire() -> None:
                lock.acquire(blocking=True)

            yield acquire, lock.release
        finally:
            client.close()
    else:
        raise ValueError(f"unknown peer {spec.key!r}")


def unavailable(spec: PeerSpec) -> str | None:
    """Why ``spec`` cannot be measured here (package missing, store unreachable), or None."""
    try:
        with peer_lock(spec) as (acquire, release):
            acquire()
            release()
    except ImportError as e:
        return f"not installed ({e.name}; pip install 'django-esdlock[bench]')"
    except Exception as e:  # noqa: BLE001 - any failure to reach the store: skip the peer
        return f"not reachable at {spec.url.split('@')[-1]}: {type(e).__name__}: {e}"
    return None
