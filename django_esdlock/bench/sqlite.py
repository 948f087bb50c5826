"""SQLite baselines: a durable one-row insert + delete pair in the lock file; bulk fills of the embedded default."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

from .kit import Baseline, RequestCount, StoreKit, bench_owner, fill_nodes, statements_counted

# One node row and one holder row per filled lock (the layout of backends/database/sqlite/dialect.py),
# the holder's lease set by SQLite's clock like the backend's.
FILL_NODE = "INSERT INTO esdlock_node (id, namespace, kind, key, parent, depth) VALUES (?, ?, 'tree', ?, '', 1)"
FILL_HOLDER = """
INSERT INTO esdlock_holder
    (node_id, holder_id, mode, owner, owner_key, token, acquired_at, expires_at, intent, checkpoint, recovery)
VALUES (?, ?, 'X', ?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now', ?, '-1 hour'),
        strftime('%Y-%m-%d %H:%M:%f', 'now', ?), NULL, NULL, NULL)
"""


class SqliteKit(StoreKit):
    """The lock file of the run (WAL, as the backend switches it), plus one plain sqlite3 connection for baselines."""

    name = "sqlite"
    request_word = "round trips"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.path: str = config["OPTIONS"]["url"].removeprefix("sqlite:///")
        # Autocommit: each statement its own durable transaction, as the lock's are.
        self.raw = sqlite3.connect(self.path, isolation_level=None, timeout=30, check_same_thread=False)
        self.raw.execute("PRAGMA journal_mode = WAL")
        self.raw.execute("CREATE TABLE IF NOT EXISTS esdlock_bench_row (id text PRIMARY KEY)")

    def baselines(self, depth: int) -> list[Baseline]:
        return [Baseline("row", "durable 1-row INSERT + DELETE", self.row_pair)]

    def row_pair(self) -> None:
        """Insert one row and delete it, two committed transactions in the lock file."""
        self.raw.execute("INSERT INTO esdlock_bench_row (id) VALUES (?)", ("bench",))
        self.raw.execute("DELETE FROM esdlock_bench_row WHERE id = ?", ("bench",))

    def counting(self) -> contextlib.AbstractContextManager[RequestCount]:
        """Count statements on the calling thread's lock connection (in-process calls, not network round trips)."""
        return statements_counted(self.backend)

    def fill(self, namespace: str, count: int, *, expired: bool) -> None:
        nodes = list(fill_nodes(namespace, count))
        owner = bench_owner()
        shift = "-1 hour" if expired else "+1 day"
        with contextlib.closing(self.raw.cursor()) as cursor:
            cursor.execute("BEGIN IMMEDIATE")
            try:
                token = cursor.execute("SELECT value FROM esdlock_token").fetchone()[0]
                cursor.execute("UPDATE esdlock_token SET value = value + ?", (count,))
                cursor.executemany(FILL_NODE, [(node.id, namespace, node.key) for node in nodes])
                cursor.executemany(
                    FILL_HOLDER,
                    [
                        (node.id, f"fill-{i}", json.dumps(owner), owner["key"], token + i + 1, shift, shift)
                        for i, node in enumerate(nodes)
                    ],
                )
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
            cursor.execute("COMMIT")
        self.raw.execute("ANALYZE")

    def delete_raw(self, namespace: str, count: int) -> None:
        with contextlib.closing(self.raw.cursor()) as cursor:
            cursor.execute("BEGIN IMMEDIATE")
            cursor.execute("DELETE FROM esdlock_holder WHERE holder_id LIKE 'fill-%'")
            cursor.execute(
                "DELETE FROM esdlock_node WHERE namespace = ? AND NOT EXISTS "
                "(SELECT 1 FROM esdlock_holder h WHERE h.node_id = esdlock_node.id)",
                (namespace,),
            )
            cursor.execute("COMMIT")

    def facts(self) -> dict[str, Any]:
        journal_mode = self.raw.execute("PRAGMA journal_mode").fetchone()[0]
        return {"sqlite_version": sqlite3.sqlite_version, "journal_mode": journal_mode}

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.raw.close()
        super().close()
