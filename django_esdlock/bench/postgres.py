"""PostgreSQL baselines: a durable one-row insert + delete pair and a ``pg_advisory_lock`` pair."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import psycopg

from .common import ratio_at_least
from .kit import Baseline, RequestCount, StoreKit, bench_owner, fill_nodes, statements_counted

ADVISORY_KEY = 0x62_65_6E_63_68  # "bench"

ROW_GOALS = {4: ratio_at_least(0.8), 16: ratio_at_least(0.6)}
"""A tree lock pair against the durable one-row pair: the limit a durable grant approaches."""

# One node and one grant per filled lock, written by two set-based statements.
FILL_NODES = """
INSERT INTO esdlock_node (id, namespace, kind, key, parent, depth, entries)
SELECT n.id, %(namespace)s, 'tree', n.key, '', 1, jsonb_build_object('fill-' || n.i, 'X')
FROM unnest(%(ids)s::text[], %(keys)s::text[]) WITH ORDINALITY AS n(id, key, i)
"""
FILL_GRANTS = """
INSERT INTO esdlock_grant (holder_id, nodes, owner, owner_key, token, acquired_at, expires_at)
SELECT 'fill-' || n.i, jsonb_build_object(n.id, 'X'), %(owner)s::jsonb, %(owner_key)s, nextval('esdlock_token_seq'),
       now() + %(shift)s::interval - interval '1 hour', now() + %(shift)s::interval
FROM unnest(%(ids)s::text[]) WITH ORDINALITY AS n(id, i)
"""
DELETE_FILLED = """
WITH gone AS (DELETE FROM esdlock_grant WHERE holder_id LIKE 'fill-%%')
DELETE FROM esdlock_node WHERE id = ANY(%(ids)s::text[])
"""


class PostgresKit(StoreKit):
    """The lock database of the run, plus one plain psycopg connection for the baselines."""

    name = "postgres"
    request_word = "round trips"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.url: str = config["OPTIONS"]["url"]
        # Plain psycopg, autocommit: each statement is its own durable transaction.
        self.raw = psycopg.connect(self.url, autocommit=True)
        self.raw.execute("CREATE TABLE IF NOT EXISTS esdlock_bench_row (id text PRIMARY KEY)")

    def baselines(self, depth: int) -> list[Baseline]:
        return [
            Baseline("row", "durable 1-row INSERT + DELETE", self.row_pair, ROW_GOALS.get(depth)),
            Baseline("advisory", "pg_advisory_lock + unlock", self.advisory_pair),
        ]

    def row_pair(self) -> None:
        """Insert one row and delete it, two committed transactions: what a durable lock pair needs at least."""
        self.raw.execute("INSERT INTO esdlock_bench_row (id) VALUES (%s)", ("bench",))
        self.raw.execute("DELETE FROM esdlock_bench_row WHERE id = %s", ("bench",))

    def advisory_pair(self) -> None:
        """Take and give back a session advisory lock: two round trips, nothing written."""
        self.raw.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_KEY,))
        self.raw.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_KEY,))

    def counting(self) -> contextlib.AbstractContextManager[RequestCount]:
        """Count statements on the calling thread's lock connection: each one is a round trip."""
        return statements_counted(self.backend)

    def fill(self, namespace: str, count: int, *, expired: bool) -> None:
        nodes = list(fill_nodes(namespace, count))
        owner = bench_owner()
        params = {
            "namespace": namespace,
            "ids": [node.id for node in nodes],
            "keys": [node.key for node in nodes],
            "owner": json.dumps(owner),
            "owner_key": owner["key"],
            "shift": "-1 hour" if expired else "1 day",
        }
        with self.raw.transaction():
            self.raw.execute(FILL_NODES, params)
            self.raw.execute(FILL_GRANTS, params)
        # Statistics, as autovacuum would have gathered by the time a table holds this many rows.
        self.raw.execute("ANALYZE esdlock_node, esdlock_grant")

    def delete_raw(self, namespace: str, count: int) -> None:
        self.raw.execute(DELETE_FILLED, {"ids": [node.id for node in fill_nodes(namespace, count)]})

    def facts(self) -> dict[str, Any]:
        settings = ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
        return {name: self.raw.execute(f"SHOW {name}").fetchone()[0] for name in settings}

    def close(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.raw.close()
        super().close()
