"""Make a lease run out in the store itself (back-date it), instead of sleeping until it probably has."""

from __future__ import annotations

import datetime
import sqlite3
import time
from collections.abc import Callable

import psycopg

from django_esdlock.conf import load_backend

from .dbstores import holder_table, sqlite_path, url_of

LONG_AGO = "2000-01-01 00:00:00.000"


def backdate(config: dict, holder_id: str) -> None:
    """Move every lease of ``holder_id`` an hour (or years) into the past, in the store ``config`` names.

    The store judges it expired by its own clock at once: no wait past a TTL,
    and no race with Elasticsearch's cached clock (which lags by up to 200 ms).
    """
    if "hosts" in config["OPTIONS"]:
        _backdate_elasticsearch(config, holder_id)
    elif url_of(config).startswith("sqlite"):
        with sqlite3.connect(sqlite_path(config), timeout=30) as connection:
            done = connection.execute(
                f"UPDATE {holder_table(config)} SET expires_at = ? WHERE holder_id = ?", [LONG_AGO, holder_id]
            ).rowcount
        connection.close()
        assert done, f"no lease of {holder_id} to back-date"
    else:
        with psycopg.connect(url_of(config), autocommit=True) as connection:
            done = connection.execute(
                f"UPDATE {holder_table(config)} SET expires_at = %s WHERE holder_id = %s", [LONG_AGO, holder_id]
            ).rowcount
        assert done, f"no lease of {holder_id} to back-date"


def _backdate_elasticsearch(config: dict, holder_id: str) -> None:
    backend = load_backend(config)
    try:
        long_ago = int(time.time() * 1000) - 3_600_000
        found = 0
        for index in backend.lock_indices:
            backend.client.indices.refresh(index=index, ignore_unavailable=True)
            answer = backend.client.search(
                index=index, query={"match_all": {}}, size=1000, seq_no_primary_term=True, ignore_unavailable=True
            )
            for hit in answer["hits"]["hits"]:
                holders = hit["_source"].get("holders") or []
                mine = [h for h in holders if h.get("id") == holder_id]
                if not mine:
                    continue
                for holder in mine:
                    holder["acquired_at"] = long_ago - 1
                    holder["expires_at"] = long_ago
                backend.client.index(
                    index=hit["_index"],
                    id=hit["_id"],
                    document=hit["_source"],
                    if_seq_no=hit["_seq_no"],
                    if_primary_term=hit["_primary_term"],
                    refresh=True,
                )
                found += len(mine)
        assert found, f"no lease of {holder_id} to back-date"
    finally:
        backend.close()


def wait_until(predicate: Callable[[], object], *, what: str, timeout: float = 30.0, every: float = 0.02) -> object:
    """Poll ``predicate`` until it returns something true (returned); fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout:g}s"
        time.sleep(every)
    return value


def wait_renewed(backend, lock, *, leases: int, ttl: float, timeout: float = 60.0) -> None:
    """Until the store shows ``lock``'s lease renewed ``leases`` - 1 leases past its first expiry.

    "The lock outlived three leases", read in the store's record of it: a
    renewer at work, not a wait for the clock to pass a moment.
    """
    node = lock.targets[-1][0]

    def expiry():
        records = [r for r in backend.node_holders(node) if r.holder_id == lock.holder_id]
        assert records, f"{lock!r} is no longer in the store"
        return records[0].expires_at

    target = expiry() + datetime.timedelta(seconds=(leases - 1) * ttl)
    wait_until(lambda: expiry() >= target, what=f"{lock!r} renewed past {leases} leases", timeout=timeout)
