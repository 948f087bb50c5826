"""SQLite dialect of the database lock backend: the zero-setup embedded default.

Within these limits it keeps the semantics of PostgreSQL on one machine:

- one machine only: the database file must be on a local disk (not NFS);
- every lock write takes SQLite's single write lock (``BEGIN IMMEDIATE``), so
  lock traffic is serialized and queues for up to the busy timeout
  (OPTIONS ``timeout``, default 20 s here) before ``LockBackendUnavailable``;
- the file is switched to WAL journal mode (a persistent setting) so that a
  caller's open read transaction does not block lock writes;
- a lock taken inside a transaction that has already *written* to the same
  SQLite file waits for that transaction's write lock, i.e. for the busy
  timeout, then fails: take locks before writing, or keep locks in a file of
  their own (``LOCK_BACKEND = "sqlite:////var/lib/app/locks.sqlite3"``);
- no notification: waiters poll with capped exponential backoff.

Layout: one ``esdlock_node`` row per held node (deleted with its last
holder), one ``esdlock_holder`` row per holder of a node, markers in
``esdlock_waiter``. A holder's intent and checkpoint are on the row of its
main node (its S or X node) alone; its other rows (IS/IX ancestors, shared
with every other lock below them) count as carrying it (:func:`_has_intent`).
Rules every statement keeps: values only as parameters;
node ids as one JSON array parameter (``json_each``), so each statement is
one constant text whatever the number of nodes; each transaction reads the
clock once (``NOW``) and passes it on, so all its statements agree; a holder
is released or renewed only by its owner (``owner_key``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import Error as DjangoDatabaseError

from .... import modes
from ....modes import Mode
from ....protocol import decide  # SQLite runs the reference model itself
from ....records import Grant, HolderRecord, LockRequest, Node
from ....steps import Steps, drive
from ..dialect import Dialect, Work
from ..queries import page_query, records_query
from ..rows import json_text, node_row, record
from ..statements import Fetch, Statement, on_cursor

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock file, concurrent first uses may race
    fcntl = None  # type: ignore[assignment]

TOKEN_COUNTER = "esdlock_token"
"""The one-row table fencing tokens come from."""

SQLITE_BUSY_TIMEOUT = 20.0
"""Seconds a SQLite lock transaction waits for the write lock, unless OPTIONS['timeout'] says otherwise."""

SQLITE_WAL_SWITCH_TIMEOUT_MS = 200


# SQLite's clock as text in the format it stores DateTimeField values in.
_SQLITE_TIME = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', %(now)s, %(offset)s)"
_SQLITE_IDS = "(SELECT value FROM json_each(%(ids)s))"


def _sqlite_ms(column: str) -> str:
    return f"CAST(round((julianday({column}) - 2440587.5) * 86400000.0) AS INTEGER)"


def _has_intent(row: str) -> str:
    """Whether the holder of row ``row`` carries an intent, on this row or its main node's: expired, it blocks."""
    return f"EXISTS (SELECT 1 FROM esdlock_holder i WHERE i.holder_id = {row}.holder_id AND i.intent IS NOT NULL)"


class SQLiteSQL:
    """Statements for SQLite: ``BEGIN IMMEDIATE`` makes every write transaction the only one.

    Node ids come as one JSON array parameter (``json_each``), so each statement
    is one constant text whatever the number of nodes. Each transaction reads
    the clock once (``NOW``) and passes it on, so all its statements agree.
    """

    BEGIN = "BEGIN IMMEDIATE"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    CHECK = "SELECT 1"

    JOURNAL_MODE = "PRAGMA journal_mode"
    USE_WAL = "PRAGMA journal_mode = WAL"

    NOW = "SELECT strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    TIME = f"SELECT {_SQLITE_TIME}"
    """The time ``%(offset)s`` (e.g. ``'-1.500 seconds'``) after ``%(now)s``, as stored text."""

    CREATE_NODES = """
INSERT OR IGNORE INTO esdlock_node (id, namespace, kind, key, parent, depth)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]')
FROM json_each(%(nodes)s)
"""
    # An expired holder still counts while it is in its lock delay (ended after %(cut)s) or carries an intent;
    # the intent is looked up only for expired ones.
    READ_HOLDERS = f"""
SELECT h.node_id, h.holder_id, h.mode, h.owner_key,
       h.expires_at <= %(now)s AND (h.expires_at > %(cut)s OR {_has_intent("h")}), h.expires_at > %(now)s
FROM esdlock_holder h
WHERE h.node_id IN {_SQLITE_IDS}
"""
    # A semaphore's limit as its holders recorded it (see protocol rule 5).
    READ_LIMITS = f"SELECT id, holder_limit FROM esdlock_node WHERE id IN {_SQLITE_IDS} AND holder_limit IS NOT NULL"
    WRITE_LIMIT = f"UPDATE esdlock_node SET holder_limit = %(holder_limit)s WHERE id IN {_SQLITE_IDS}"
    READ_WAITERS = f"""
SELECT node_id, holder_id, mode, ticket FROM esdlock_waiter WHERE node_id IN {_SQLITE_IDS} AND expires_at > %(now)s
"""
    # A queued request leaves its markers on the nodes that refused it, or
    # renews those past half their lease (%(renew_before)s); rowcount says
    # whether anything was written.
    WRITE_MARKERS = f"""
INSERT INTO esdlock_waiter (node_id, holder_id, mode, ticket, expires_at, channel, owner)
SELECT json_extract(value, '$[0]'), %(holder_id)s, json_extract(value, '$[1]'), %(ticket)s, {_SQLITE_TIME}, '',
       %(owner)s
FROM json_each(%(refused)s) WHERE true
ON CONFLICT (node_id, holder_id) DO UPDATE
    SET mode = excluded.mode, ticket = excluded.ticket, expires_at = excluded.expires_at
    WHERE esdlock_waiter.expires_at < %(renew_before)s OR esdlock_waiter.mode <> excluded.mode
       OR esdlock_waiter.ticket <> excluded.ticket
"""
    # A granted request's markers go, and expired ones on its nodes.
    DROP_MARKERS = f"""
DELETE FROM esdlock_waiter WHERE node_id IN {_SQLITE_IDS} AND (holder_id = %(holder_id)s OR expires_at <= %(now)s)
"""
    WITHDRAW = f"DELETE FROM esdlock_waiter WHERE node_id IN {_SQLITE_IDS} AND holder_id = %(holder_id)s"
    DROP_EXPIRED_MARKERS = "DELETE FROM esdlock_waiter WHERE expires_at <= %(now)s"
    WAITERS = f"""
SELECT w.node_id, n.namespace, n.kind, n.key, w.holder_id, w.mode, w.ticket, {_sqlite_ms("w.expires_at")}, w.owner
FROM esdlock_waiter w LEFT JOIN esdlock_node n ON n.id = w.node_id
WHERE w.expires_at > %(now)s AND (%(all)s OR w.node_id IN {_SQLITE_IDS})
ORDER BY w.node_id, w.ticket
"""
    # Holders without an intent that expired before %(cut)s (past their lock delay) go; so does an earlier
    # copy of this holder (a retried request), which is written afresh below.
    EVICT_FOR_ACQUIRE = f"""
DELETE FROM esdlock_holder
WHERE node_id IN {_SQLITE_IDS}
  AND (holder_id = %(holder_id)s OR (expires_at <= %(cut)s AND NOT {_has_intent("esdlock_holder")}))
"""
    NEXT_TOKEN = f"UPDATE {TOKEN_COUNTER} SET value = value + 1"
    RAISE_TOKEN_FLOOR = f"UPDATE {TOKEN_COUNTER} SET value = %(floor)s WHERE value < %(floor)s"
    READ_TOKEN = f"SELECT value FROM {TOKEN_COUNTER}"
    # ``taken``: [node id, mode, whether it is a main node (the intent goes there alone)].
    WRITE_HOLDERS = f"""
INSERT INTO esdlock_holder
    (node_id, holder_id, mode, owner, owner_key, token, acquired_at, expires_at, intent, checkpoint, recovery)
SELECT json_extract(value, '$[0]'), %(holder_id)s, json_extract(value, '$[1]'), %(owner)s, %(owner_key)s,
       %(token)s, %(now)s, {_SQLITE_TIME}, CASE WHEN json_extract(value, '$[2]') THEN %(intent)s END, NULL, NULL
FROM json_each(%(taken)s)
"""
    # A null owner key releases whoever owns the holder (a forced release).
    RELEASE_HOLDER = f"""
DELETE FROM esdlock_holder
WHERE node_id IN {_SQLITE_IDS} AND holder_id = %(holder_id)s AND (%(owner_key)s IS NULL OR owner_key = %(owner_key)s)
"""
    EVICT_EXPIRED_ON = f"""
DELETE FROM esdlock_holder
WHERE node_id IN {_SQLITE_IDS} AND expires_at <= %(cutoff)s AND NOT {_has_intent("esdlock_holder")}
"""
    DELETE_EMPTY_NODES = f"""
DELETE FROM esdlock_node
WHERE id IN {_SQLITE_IDS} AND NOT EXISTS (SELECT 1 FROM esdlock_holder h WHERE h.node_id = esdlock_node.id)
"""
    # The checkpoint goes to the main nodes (``main_ids``) alone.
    RENEW = f"""
UPDATE esdlock_holder
SET expires_at = {_SQLITE_TIME}, token = %(token)s,
    checkpoint = CASE WHEN node_id IN (SELECT value FROM json_each(%(main_ids)s))
                      THEN COALESCE(%(checkpoint)s, checkpoint) ELSE checkpoint END,
    recovery = COALESCE(%(recovery)s, recovery)
WHERE node_id IN {_SQLITE_IDS} AND holder_id = %(holder_id)s AND owner_key = %(owner_key)s
  AND expires_at > %(now)s
"""
    TAKE_OVER_ARBITER = f"""
SELECT 1 FROM esdlock_holder
WHERE node_id = %(arbiter)s AND holder_id = %(holder_id)s
  AND (%(expected_owner_key)s IS NULL OR owner_key = %(expected_owner_key)s)
  AND (expires_at <= %(now)s OR NOT %(require_expired)s)
  AND (expires_at > %(now)s OR NOT %(require_live)s)
  AND (%(expected_expires_ms)s IS NULL OR {_sqlite_ms("expires_at")} = %(expected_expires_ms)s)
"""
    TAKE_OVER_TAKEN = f"SELECT node_id FROM esdlock_holder WHERE node_id IN {_SQLITE_IDS} AND holder_id = %(holder_id)s"
    TAKE_OVER = f"""
UPDATE esdlock_holder
SET owner = %(owner)s, owner_key = %(owner_key)s, token = %(token)s, recovery = %(recovery)s,
    expires_at = {_SQLITE_TIME}
WHERE node_id IN {_SQLITE_IDS} AND holder_id = %(holder_id)s
"""

    RECORD_COLUMNS = f"""
n.namespace, n.kind, n.key, h.node_id, h.holder_id, h.mode, h.owner, h.token,
{_sqlite_ms("h.acquired_at")}, {_sqlite_ms("h.expires_at")}, h.intent, h.checkpoint, h.recovery, n.holder_limit
"""
    NODE_ORDER = "n.namespace, n.kind, n.key"
    _HOLDERS = {"holders_join": "JOIN esdlock_holder h ON h.node_id = n.id"}
    PAGE = page_query(
        RECORD_COLUMNS,
        NODE_ORDER,
        "h.holder_id",
        node_columns="n.id, n.namespace, n.kind, n.key, n.holder_limit",
        holders_of_n="esdlock_holder h WHERE h.node_id = n.id AND",
        **_HOLDERS,
    )
    AFTER = "(n.namespace, n.kind, n.key) > (%(after_namespace)s, %(after_kind)s, %(after_key)s)"
    NODE_FILTERS = {
        "namespace": "n.namespace = %(namespace)s",
        "path_prefix": "substr(n.key, 1, %(prefix_length)s) = %(path_prefix)s",
        "top_level": "n.kind = 'tree' AND n.depth = 1",
        "parent": "n.kind = 'tree' AND n.parent = %(parent)s",
        # Narrowing by what a holder filter asks, where the store has a faster way (see PostgreSQL).
        "node": "n.id = %(node_id)s",
        "holder": "n.id IN (SELECT node_id FROM esdlock_holder WHERE holder_id = %(holder_id)s)",
        "on_nodes": f"n.id IN {_SQLITE_IDS}",
        "evictable": "1 = 1",
        "awaiting_recovery": "1 = 1",
    }
    HOLDER_FILTERS = {
        "mode": "h.mode = %(mode)s",
        "host": "json_extract(h.owner, '$.host') = %(host)s",
        "expired": "h.expires_at <= %(now)s",
        "live": "h.expires_at > %(now)s",
        "blocking": f"(h.expires_at > %(now)s OR {_has_intent('h')})",
        "holder_id": "h.holder_id = %(holder_id)s",
        "node_id": "h.node_id = %(node_id)s",
        "on_nodes": f"h.node_id IN {_SQLITE_IDS}",
        "evictable": f"h.expires_at <= %(cutoff)s AND NOT {_has_intent('h')}",
        "awaiting_recovery": f"h.expires_at <= %(cutoff)s AND {_has_intent('h')}",
    }
    RECORDS = records_query(RECORD_COLUMNS, NODE_ORDER, "h.holder_id", **_HOLDERS)


def _offset(ms: int) -> str:
    return f"{ms / 1000:+.3f} seconds"


def _now_steps() -> Steps[str]:
    row = yield Statement(SQLiteSQL.NOW, [], Fetch.ONE)
    return row[0]


def _time_steps(now: str, offset_ms: int) -> Steps[str]:
    row = yield Statement(SQLiteSQL.TIME, {"now": now, "offset": _offset(offset_ms)}, Fetch.ONE)
    return row[0]


def _next_token_steps() -> Steps[int]:
    yield Statement(SQLiteSQL.NEXT_TOKEN, [])
    row = yield Statement(SQLiteSQL.READ_TOKEN, [], Fetch.ONE)
    return row[0]


class SQLiteDialect(Dialect):
    """SQLite: every lock operation is a short ``BEGIN IMMEDIATE`` transaction of a few statements."""

    vendor = "sqlite"
    display_name = "SQLite"
    url_schemes = frozenset({"sqlite"})
    needs_database_file = True
    setup_may_race = True
    BEGIN = SQLiteSQL.BEGIN
    PAGE = SQLiteSQL.PAGE
    RECORDS = SQLiteSQL.RECORDS
    AFTER = SQLiteSQL.AFTER
    NODE_FILTERS = SQLiteSQL.NODE_FILTERS
    HOLDER_FILTERS = SQLiteSQL.HOLDER_FILTERS

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def describe(self, settings_dict: dict[str, Any]) -> str:
        return f"SQLite {settings_dict['NAME']}"

    def endpoints(self, settings_dict: dict[str, Any]) -> tuple[list[tuple[str, int]], str]:
        return [], "SQLite is a local file: there is no connection to cut"

    @contextlib.contextmanager
    def setup_guard(self, wrapper: Any, settings_dict: dict[str, Any]) -> Iterator[None]:
        """A lock file beside the database, for the time of the migrations."""
        if fcntl is None:
            yield
            return
        # Migrations record what they applied after applying it: a second
        # process that looks in between would create the tables again.
        with open(f"{settings_dict['NAME']}.setup-lock", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)

    def connection_options(self, options: dict[str, Any], ttl: float) -> dict[str, Any]:
        return {"timeout": SQLITE_BUSY_TIMEOUT, **options}

    def call_timeout(self, wrapper: Any, cursor: Any, ms: int | None) -> None:
        # What a lock call may wait for is the write lock: the busy timeout bounds it.
        if ms is None:
            ms = round(float(wrapper.settings_dict["OPTIONS"]["timeout"]) * 1000)
        cursor.execute(f"PRAGMA busy_timeout = {ms:d}", [])

    def prepare(self, wrapper: Any, cursor: Any) -> None:
        cursor.execute(SQLiteSQL.JOURNAL_MODE, [])
        if cursor.fetchone()[0] != "wal":
            # Briefly: a caller's open transaction on the file makes the
            # switch wait, and the switch is only an improvement.
            timeout_ms = round(float(wrapper.settings_dict["OPTIONS"]["timeout"]) * 1000)
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_WAL_SWITCH_TIMEOUT_MS}", [])
            with contextlib.suppress(DjangoDatabaseError):
                cursor.execute(SQLiteSQL.USE_WAL, [])
            cursor.execute(f"PRAGMA busy_timeout = {timeout_ms:d}", [])

    def is_missing_schema(self, error: BaseException) -> bool:
        return "no such table: esdlock_" in str(error)

    def with_clock_steps(self, params: dict[str, Any]) -> Steps[dict[str, Any]]:
        now = yield from _now_steps()
        cutoff = yield from _time_steps(now, -params.get("grace_ms", 0))
        return {**params, "now": now, "cutoff": cutoff}

    def _delay_cut_steps(self, now: str) -> Steps[str]:
        """Return the time the lock delay before ``now``: a holder that expired after it still counts."""
        if not self.lock_delay_ms:
            return now
        return (yield from _time_steps(now, -self.lock_delay_ms))

    # SQLite has no async API of its own: the Dialect's blocking methods
    # drive these steps, acquire's its own (it commits only what it wrote).

    def acquire(self, cursor: Any, request: LockRequest, nodes: list[Node], marker_ttl_ms: int) -> Work:
        return drive(self.acquire_work_steps(request, nodes, marker_ttl_ms), on_cursor(cursor))

    def acquire_work_steps(
        self, request: LockRequest, nodes: list[Node], marker_ttl_ms: int
    ) -> Steps[tuple[Grant | None, bool]]:
        """Return ``(the grant or None, commit)``: a refusal commits only the markers it left or renewed."""
        now = yield from _now_steps()
        cut = yield from self._delay_cut_steps(now)
        ids = json.dumps([node.id for node in nodes])
        holders = yield Statement(SQLiteSQL.READ_HOLDERS, {"ids": ids, "now": now, "cut": cut}, Fetch.ALL)
        waiters = yield Statement(SQLiteSQL.READ_WAITERS, {"ids": ids, "now": now}, Fetch.ALL)
        limits = None
        if request.holder_limit is not None:
            limits = dict((yield Statement(SQLiteSQL.READ_LIMITS, {"ids": ids}, Fetch.ALL)))
        decision = decide(request, holders, waiters, limits)
        if decision.refused:
            if request.ticket is None:
                return None, False
            renew_before = yield from _time_steps(now, marker_ttl_ms // 2)
            marker = {
                "refused": json.dumps([[node.id, mode.value] for node, mode in decision.refused]),
                "holder_id": request.holder_id,
                "ticket": request.ticket,
                "owner": json_text(request.owner.as_dict()),
                "renew_before": renew_before,
            }
            written = yield Statement(
                SQLiteSQL.WRITE_MARKERS, {**marker, "now": now, "offset": _offset(marker_ttl_ms)}, Fetch.ROWCOUNT
            )
            return None, written > 0
        yield Statement(SQLiteSQL.CREATE_NODES, {"nodes": json.dumps([node_row(node) for node in nodes])})
        yield Statement(SQLiteSQL.EVICT_FOR_ACQUIRE, {"ids": ids, "holder_id": request.holder_id, "cut": cut})
        if request.ticket is not None:
            yield Statement(SQLiteSQL.DROP_MARKERS, {"ids": ids, "holder_id": request.holder_id, "now": now})
        if decision.holder_limit is not None:
            yield Statement(SQLiteSQL.WRITE_LIMIT, {"ids": ids, "holder_limit": decision.holder_limit})
        token = yield from _next_token_steps()
        yield Statement(
            SQLiteSQL.WRITE_HOLDERS,
            {
                "taken": json.dumps([[node.id, mode.value, modes.is_grant(mode)] for node, mode in decision.writes]),
                "holder_id": request.holder_id,
                "owner": json_text(request.owner.as_dict()),
                "owner_key": request.owner.key,
                "token": token,
                "now": now,
                "offset": _offset(request.ttl_ms),
                "intent": json_text(request.intent),
            },
        )
        taken = tuple(node for node, _ in decision.writes)
        return Grant(request=request, token=token, taken=taken, holder_limit=decision.holder_limit), True

    def release_steps(
        self, holder_id: str, owner_key: str | None, released: Sequence[tuple[Node, Mode | None]]
    ) -> Steps[bool]:
        ids = sorted({node.id for node, _ in released})
        now = yield from _now_steps()
        id_list = json.dumps(ids)
        params = {"ids": id_list, "holder_id": holder_id, "owner_key": owner_key}
        removed = yield Statement(SQLiteSQL.RELEASE_HOLDER, params, Fetch.ROWCOUNT)
        cut = yield from self._delay_cut_steps(now)
        yield Statement(SQLiteSQL.EVICT_EXPIRED_ON, {"ids": id_list, "cutoff": cut})
        yield Statement(SQLiteSQL.DELETE_EMPTY_NODES, {"ids": id_list})
        return removed == len(ids)

    def withdraw_steps(self, request: LockRequest) -> Steps[None]:
        ids = sorted({node.id for node, _ in request.targets})
        yield Statement(SQLiteSQL.WITHDRAW, {"holder_id": request.holder_id, "ids": json.dumps(ids)})

    def renew_steps(self, grant: Grant, checkpoint: str | None, recovery: str | None) -> Steps[bool]:
        ids = sorted({node.id for node in grant.taken})
        asked = dict(grant.request.targets)
        now = yield from _now_steps()
        params = {
            "holder_id": grant.request.holder_id,
            "owner_key": grant.request.owner.key,
            "token": grant.token,
            "checkpoint": checkpoint,
            "recovery": recovery,
            "ids": json.dumps(ids),
            "main_ids": json.dumps([node.id for node in grant.taken if modes.is_grant(asked[node])]),
            "now": now,
            "offset": _offset(grant.request.ttl_ms),
        }
        renewed = yield Statement(SQLiteSQL.RENEW, params, Fetch.ROWCOUNT)
        return renewed == len(ids)

    def take_over_steps(
        self, ids: list[str], params: dict[str, Any]
    ) -> Steps[tuple[tuple[int, set[str]] | None, bool]]:
        now = yield from _now_steps()
        arbiter = yield Statement(SQLiteSQL.TAKE_OVER_ARBITER, {**params, "now": now}, Fetch.ONE)
        if arbiter is None:
            return None, False
        id_list = json.dumps(ids)
        rows = yield Statement(SQLiteSQL.TAKE_OVER_TAKEN, {"ids": id_list, "holder_id": params["holder_id"]}, Fetch.ALL)
        taken = {row[0] for row in rows}
        token = yield from _next_token_steps()
        offset = _offset(params["ttl_ms"])
        yield Statement(SQLiteSQL.TAKE_OVER, {**params, "ids": id_list, "token": token, "now": now, "offset": offset})
        return (token, taken), True

    def evict_steps(self, rows: list[Sequence[Any]], grace_ms: int) -> Steps[tuple[list[HolderRecord], bool]]:
        id_list = json.dumps(sorted({row[3] for row in rows}))
        now = yield from _now_steps()
        cutoff = yield from _time_steps(now, -grace_ms)
        query = SQLiteSQL.RECORDS.replace("{nodes}", "1 = 1").replace(
            "{holders}", " AND ".join([SQLiteSQL.HOLDER_FILTERS["on_nodes"], SQLiteSQL.HOLDER_FILTERS["evictable"]])
        )
        evictable = yield Statement(query, {"ids": id_list, "cutoff": cutoff}, Fetch.ALL)
        found = [record(row) for row in evictable]
        yield Statement(SQLiteSQL.EVICT_EXPIRED_ON, {"ids": id_list, "cutoff": cutoff})
        yield Statement(SQLiteSQL.DELETE_EMPTY_NODES, {"ids": id_list})
        return found, True

    def raise_token_floor_steps(self, floor: int) -> Steps[tuple[bool, bool]]:
        raised = yield Statement(SQLiteSQL.RAISE_TOKEN_FLOOR, {"floor": floor}, Fetch.ROWCOUNT)
        return raised > 0, True

    def drop_expired_markers_steps(self) -> Steps[tuple[None, bool]]:
        now = yield from _now_steps()
        yield Statement(SQLiteSQL.DROP_EXPIRED_MARKERS, {"now": now})
        return None, True

    def wait_state_steps(self, ids: list[str] | None) -> Steps[tuple[tuple[list[Any], list[Any]], bool]]:
        now = yield from _now_steps()  # both reads judge by this one clock: that, not a transaction, makes them agree
        params = {"all": ids is None, "ids": json.dumps(ids or []), "now": now}
        markers = yield Statement(SQLiteSQL.WAITERS, params, Fetch.ALL)
        on = json.dumps(sorted({row[0] for row in markers}))
        query = SQLiteSQL.RECORDS.replace("{nodes}", SQLiteSQL.NODE_FILTERS["on_nodes"]).replace(
            "{holders}", SQLiteSQL.HOLDER_FILTERS["blocking"]
        )
        holders = yield Statement(query, {"ids": on, "now": now}, Fetch.ALL)
        return (markers, holders), False
