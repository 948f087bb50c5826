"""Leases made to run out in the store itself, instead of waited out.

A test that needs an expired holder (or waiting marker) takes it with an
ordinary lease and then moves its ``expires_at`` back, as an operator or a
clock would: in SQL by an UPDATE, in Elasticsearch by rewriting the node
document. The backend under test then judges it by the store's clock, as it
always does, with no sleep in the test and no race with Elasticsearch's cached
clock (``ctx._now`` lags by up to 200 ms): by default leases move back by
decades.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterable

import psycopg

from django_esdlock.backends.database import DatabaseLockBackend

DECADES = 20 * 365 * 86400.0
"""The default shift: far past any clock skew, lag or ``--grace``."""


def expire(backend, *holder_ids: str, holders: bool = True, markers: bool = False, by: float = DECADES) -> int:
    """Move back by ``by`` seconds the leases of ``holder_ids`` (every holder if none is named); return how many moved.

    ``markers``: the waiting markers of those request ids too (``holders=False``: those alone).
    Fails when nothing matched: a test's premise that something is held is part of what it checks.
    """
    if isinstance(backend, DatabaseLockBackend):
        moved = _expire_sql(backend, holder_ids, holders=holders, markers=markers, by=by)
    else:
        moved = _expire_elasticsearch(backend, set(holder_ids), holders=holders, markers=markers, by=by)
    assert moved, f"nothing to expire in the store (holder ids {list(holder_ids) or 'any'})"
    return moved


# --- SQL --------------------------------------------------------------------------------------


def _expire_sql(backend, holder_ids: Iterable[str], *, holders: bool, markers: bool, by: float) -> int:
    ids = list(holder_ids)
    tables = []
    if holders:
        tables.append("esdlock_holder" if backend.vendor == "sqlite" else "esdlock_grant")
    if markers:
        tables.append("esdlock_waiter")
    settings = backend.connection.settings_dict  # the lock connection's (its NAME follows the test runner)
    moved = 0
    if backend.vendor == "sqlite":
        # SQLite keeps timestamps as text, in the backend's own format.
        shift = "strftime('%Y-%m-%d %H:%M:%f', expires_at, ?)"
        with contextlib.closing(sqlite3.connect(settings["NAME"], timeout=30)) as connection, connection:
            for table in tables:
                where, params = _where(ids, "?")
                moved += connection.execute(
                    f"UPDATE {table} SET expires_at = {shift}{where}", [f"-{by:.3f} seconds", *params]
                ).rowcount
        return moved
    connect = {"dbname": settings["NAME"], "user": settings["USER"] or None, "password": settings["PASSWORD"] or None}
    connect |= {"host": settings["HOST"] or None, "port": settings["PORT"] or None}
    with psycopg.connect(**{k: v for k, v in connect.items() if v is not None}, autocommit=True) as connection:
        for table in tables:
            where, params = _where(ids, "%s")
            moved += connection.execute(
                f"UPDATE {table} SET expires_at = expires_at - make_interval(secs => %s){where}", [by, *params]
            ).rowcount
    return moved


def _where(ids: list[str], placeholder: str) -> tuple[str, list[str]]:
    if not ids:
        return "", []
    return f" WHERE holder_id IN ({', '.join([placeholder] * len(ids))})", ids


# --- Elasticsearch ----------------------------------------------------------------------------


def _expire_elasticsearch(backend, ids: set[str], *, holders: bool, markers: bool, by: float) -> int:
    client = backend.client.options(ignore_status=(404, 409))
    indices = ",".join(backend.lock_indices)
    client.indices.refresh(index=indices, ignore_unavailable=True)
    found = client.search(index=indices, query={"match_all": {}}, size=10_000, ignore_unavailable=True)
    moved = 0
    for hit in found.get("hits", {}).get("hits", []):
        moved += _rewrite(client, hit["_index"], hit["_id"], ids, holders=holders, markers=markers, by_ms=by * 1000)
    client.indices.refresh(index=indices, ignore_unavailable=True)  # searches (listing, reaping) see it at once
    return moved


def _rewrite(client, index: str, doc_id: str, ids: set[str], *, holders: bool, markers: bool, by_ms: float) -> int:
    """Back-date the matching entries of one node document, retrying when a concurrent write changed it."""
    for _ in range(20):
        current = client.get(index=index, id=doc_id)  # realtime: the latest version
        if not current.get("found"):
            return 0
        source = current["_source"]
        moved = 0
        entries = []
        if holders:
            entries += source.get("holders") or []
        if markers:
            entries += [w for w in source.get("waiters") or [] if not w.get("released")]
        for entry in entries:
            if not ids or entry.get("id") in ids:
                entry["expires_at"] = int(entry["expires_at"] - by_ms)
                moved += 1
        if not moved:
            return 0
        if markers and source.get("waiting_until") is not None:
            live = [w["expires_at"] for w in source.get("waiters") or [] if not w.get("released")]
            source["waiting_until"] = max(live) if live else int(source["waiting_until"] - by_ms)
        written = client.index(
            index=index,
            id=doc_id,
            document=source,
            if_seq_no=current["_seq_no"],
            if_primary_term=current["_primary_term"],
        )
        if written.get("result") in ("created", "updated"):
            return moved
        time.sleep(0.01)  # a renewal or release changed the node meanwhile (409): read it again
    raise AssertionError(f"could not back-date {doc_id} in {index}: it kept changing")
