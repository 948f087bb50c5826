"""The SQL of the database lock backend, per database, and what each statement guarantees.

Rules every statement here keeps:

- values come only as parameters, never formatted into the text; a statement
  is a constant, or is assembled from constant fragments (listing filters);
- expiry is judged by the database's clock (``statement_timestamp()`` on
  PostgreSQL, one ``'now'`` read per transaction on SQLite), never the client's;
- a transaction that writes holders of a node first locks that node's row, and
  locks all its node rows in one statement in one global order (bytewise id
  order): every writer waits only for rows later in that order than the ones
  it holds, so no two transactions ever wait on each other in a cycle;
- a holder is released or renewed only by its owner (``owner_key``), so a
  holder a reaper took over is no longer the dead owner's to touch.
"""

from __future__ import annotations

NOTIFY_CHANNEL = "esdlock"
"""The PostgreSQL channel on which releases are announced (payload: node tags)."""

TOKEN_SEQUENCE = "esdlock_token_seq"
"""PostgreSQL: the sequence fencing tokens come from."""

TOKEN_COUNTER = "esdlock_token"
"""SQLite: the one-row table fencing tokens come from."""

SETUP_LOCK_KEY = 0x65_73_64_6C_6F_63_6B
"""PostgreSQL advisory lock key that serializes concurrent ``setup()`` calls ("esdlock")."""


def _page(record_columns: str, node_order: str, holder_order: str) -> str:
    """Pages of nodes that have a holder matching {holders}, with those holders, in node then holder order.

    ``{nodes}`` and ``{holders}`` stay in the text, filled later with joined
    constant fragments; the orders differ per database only in collation.
    """
    return f"""
WITH page AS (
    SELECT n.id, n.namespace, n.kind, n.key FROM esdlock_node n
    WHERE {{nodes}} AND EXISTS (SELECT 1 FROM esdlock_holder h WHERE h.node_id = n.id AND {{holders}})
    ORDER BY {node_order}
    LIMIT %(limit)s
)
SELECT {record_columns} FROM page n JOIN esdlock_holder h ON h.node_id = n.id
WHERE {{holders}}
ORDER BY {node_order}, {holder_order}
"""


def _records(record_columns: str, node_order: str, holder_order: str) -> str:
    """Every holder matching {nodes} and {holders} at once, in the order of :func:`_page`."""
    return f"""
SELECT {record_columns} FROM esdlock_holder h JOIN esdlock_node n ON n.id = h.node_id
WHERE {{nodes}} AND {{holders}}
ORDER BY {node_order}, {holder_order}
"""


class PostgresSQL:
    """Statements for PostgreSQL (psycopg), run at READ COMMITTED on the lock connection."""

    BEGIN = "BEGIN"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    CHECK = "SELECT 1"

    # A frozen client must not keep node rows locked for ever, nor make
    # acquirers queue behind it without end: both fail after a while instead.
    SESSION = """
SELECT set_config('lock_timeout', '10s', false), set_config('idle_in_transaction_session_timeout', '30s', false)
"""
    # A session whose client has gone while it waits for node rows stops
    # waiting (PostgreSQL 14+ notices within a second) instead of queueing
    # for rows it will only roll back.
    SESSION_CLIENT_CHECK = "SELECT set_config('client_connection_check_interval', '1s', false)"
    CLIENT_CHECK_SINCE = 140000

    # Acquire and release are server-side functions (migration 0002): see
    # their source there for what each step guarantees. Acquire opens its
    # transaction in the same round trip; release commits on its own.
    ACQUIRE = """
BEGIN; SELECT token, taken, wrote FROM esdlock_acquire(
    %(ids)s::text[], %(namespaces)s::text[], %(kinds)s::text[], %(keys)s::text[], %(parents)s::text[],
    %(depths)s::int[], %(modes)s::text[], %(conflicts)s::text[], %(holder_id)s::text, %(owner)s::jsonb,
    %(owner_key)s::text, %(ttl_ms)s::float8, %(intent)s::jsonb, %(reentrant)s::boolean, %(ticket)s::bigint,
    %(marker_ttl_ms)s::float8)
"""
    RELEASE = "SELECT esdlock_release(%(ids)s::text[], %(holder_id)s::text, %(owner_key)s::text, %(payload)s::text)"

    # A request that gave up takes its waiting markers away; expired markers go with the reaper.
    WITHDRAW = "DELETE FROM esdlock_waiter WHERE node_id = ANY(%(ids)s::text[]) AND holder_id = %(holder_id)s::text"
    DROP_EXPIRED_MARKERS = "DELETE FROM esdlock_waiter WHERE expires_at <= statement_timestamp()"

    # Eviction deletes node rows, hence FOR UPDATE (not NO KEY).
    LOCK_NODES = """
SELECT id FROM esdlock_node WHERE id = ANY(%(ids)s::text[]) ORDER BY id COLLATE "C" FOR UPDATE
"""
    LOCK_NODES_FOR_UPDATE = """
SELECT id FROM esdlock_node WHERE id = ANY(%(ids)s::text[]) ORDER BY id COLLATE "C" FOR NO KEY UPDATE
"""

    # Extend the lease of a live holder of this owner from the database's
    # now; an expired lease is never revived, a taken-over holder is not
    # ours. Returns (by rowcount) how many of its rows were renewed.
    RENEW = """
UPDATE esdlock_holder
SET expires_at = statement_timestamp() + %(ttl_ms)s::float8 * interval '1 millisecond', token = %(token)s,
    checkpoint = COALESCE(%(checkpoint)s::jsonb, checkpoint), recovery = COALESCE(%(recovery)s::jsonb, recovery)
WHERE node_id = ANY(%(ids)s::text[]) AND holder_id = %(holder_id)s AND owner_key = %(owner_key)s::text
  AND expires_at > statement_timestamp()
"""

    # Hand a holder to a new owner with a new token and lease, if its arbiter
    # row still has the owner it was read with (and, when required, has
    # expired): of reapers racing for it, the first to lock the nodes wins and
    # the others find the owner changed. Intent and checkpoint stay. Returns
    # the rows taken, with the token.
    TAKE_OVER = f"""
WITH arbiter AS (
    SELECT 1 FROM esdlock_holder
    WHERE node_id = %(arbiter)s::text AND holder_id = %(holder_id)s::text
      AND (%(expected_owner_key)s::text IS NULL OR owner_key = %(expected_owner_key)s::text)
      AND (expires_at <= statement_timestamp() OR NOT %(require_expired)s::boolean)
), token AS (
    SELECT nextval('{TOKEN_SEQUENCE}') AS value FROM arbiter
)
UPDATE esdlock_holder h
SET owner = %(owner)s::jsonb, owner_key = %(owner_key)s::text, token = token.value, recovery = %(recovery)s::jsonb,
    expires_at = statement_timestamp() + %(ttl_ms)s::float8 * interval '1 millisecond'
FROM token
WHERE h.node_id = ANY(%(ids)s::text[]) AND h.holder_id = %(holder_id)s::text
RETURNING h.node_id, token.value
"""

    # What a HolderRecord is made of, from holder `h` and node `n`.
    RECORD_COLUMNS = """
n.namespace, n.kind, n.key, h.node_id, h.holder_id, h.mode, h.owner::text, h.token,
(extract(epoch FROM h.acquired_at) * 1000)::bigint, (extract(epoch FROM h.expires_at) * 1000)::bigint,
h.intent::text, h.checkpoint::text, h.recovery::text
"""
    # Nodes ordered bytewise by namespace, kind and key, as Elasticsearch sorts keywords.
    NODE_ORDER = 'n.namespace COLLATE "C", n.kind COLLATE "C", n.key COLLATE "C"'
    PAGE = _page(RECORD_COLUMNS, NODE_ORDER, 'h.holder_id COLLATE "C"')
    AFTER = (
        '(n.namespace COLLATE "C", n.kind COLLATE "C", n.key COLLATE "C")'
        " > (%(after_namespace)s::text, %(after_kind)s::text, %(after_key)s::text)"
    )
    NODE_FILTERS = {
        "namespace": "n.namespace = %(namespace)s::text",
        "path_prefix": "left(n.key, %(prefix_length)s::int) = %(path_prefix)s::text",
        "top_level": "n.kind = 'tree' AND n.depth = 1",
        "parent": "n.kind = 'tree' AND n.parent = %(parent)s::text",
    }
    HOLDER_FILTERS = {
        "mode": "h.mode = %(mode)s::text",
        "host": "h.owner->>'host' = %(host)s::text",
        "expired": "h.expires_at <= statement_timestamp()",
        "live": "h.expires_at > statement_timestamp()",
        "holder_id": "h.holder_id = %(holder_id)s::text",
        "node_id": "h.node_id = %(node_id)s::text",
        "evictable": (
            "h.intent IS NULL"
            " AND h.expires_at <= statement_timestamp() - %(grace_ms)s::float8 * interval '1 millisecond'"
        ),
        "awaiting_recovery": (
            "h.intent IS NOT NULL"
            " AND h.expires_at <= statement_timestamp() - %(grace_ms)s::float8 * interval '1 millisecond'"
        ),
    }
    # Every matching holder at once (one holder's, one node's, the few awaiting recovery).
    RECORDS = _records(RECORD_COLUMNS, NODE_ORDER, 'h.holder_id COLLATE "C"')

    # Evict the evictable holders of the locked nodes, delete nodes left
    # empty, and return what was removed.
    EVICT = f"""
WITH h AS (
    DELETE FROM esdlock_holder h
    WHERE h.node_id = ANY(%(ids)s::text[]) AND {HOLDER_FILTERS["evictable"]}
    RETURNING h.*
), emptied AS (
    DELETE FROM esdlock_node n
    WHERE n.id = ANY(%(ids)s::text[])
      AND NOT EXISTS (SELECT 1 FROM esdlock_holder x WHERE x.node_id = n.id AND x.id NOT IN (SELECT id FROM h))
)
SELECT {RECORD_COLUMNS} FROM h JOIN esdlock_node n ON n.id = h.node_id ORDER BY {NODE_ORDER}, h.holder_id
"""


# SQLite's clock as text in the format it stores DateTimeField values in.
_SQLITE_TIME = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', %(now)s, %(offset)s)"
_SQLITE_IDS = "(SELECT value FROM json_each(%(ids)s))"


def _sqlite_ms(column: str) -> str:
    return f"CAST(round((julianday({column}) - 2440587.5) * 86400000.0) AS INTEGER)"


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
    READ_HOLDERS = f"""
SELECT node_id, holder_id, mode, owner_key, intent IS NOT NULL, expires_at > %(now)s
FROM esdlock_holder
WHERE node_id IN {_SQLITE_IDS}
"""
    READ_WAITERS = f"""
SELECT node_id, holder_id, mode, ticket FROM esdlock_waiter WHERE node_id IN {_SQLITE_IDS} AND expires_at > %(now)s
"""
    # A queued request leaves its markers on the nodes that refused it, or
    # renews those past half their lease (%(renew_before)s); rowcount says
    # whether anything was written.
    WRITE_MARKERS = f"""
INSERT INTO esdlock_waiter (node_id, holder_id, mode, ticket, expires_at)
SELECT json_extract(value, '$[0]'), %(holder_id)s, json_extract(value, '$[1]'), %(ticket)s, {_SQLITE_TIME}
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
    # Expired holders without an intent go; so does an earlier copy of this
    # holder (a retried request), which is written afresh below.
    EVICT_FOR_ACQUIRE = f"""
DELETE FROM esdlock_holder
WHERE node_id IN {_SQLITE_IDS} AND (holder_id = %(holder_id)s OR (intent IS NULL AND expires_at <= %(now)s))
"""
    NEXT_TOKEN = f"UPDATE {TOKEN_COUNTER} SET value = value + 1"
    READ_TOKEN = f"SELECT value FROM {TOKEN_COUNTER}"
    WRITE_HOLDERS = f"""
INSERT INTO esdlock_holder
    (node_id, holder_id, mode, owner, owner_key, token, acquired_at, expires_at, intent, checkpoint, recovery)
SELECT json_extract(value, '$[0]'), %(holder_id)s, json_extract(value, '$[1]'), %(owner)s, %(owner_key)s,
       %(token)s, %(now)s, {_SQLITE_TIME}, %(intent)s, NULL, NULL
FROM json_each(%(taken)s)
"""
    # A null owner key releases whoever owns the holder (a forced release).
    RELEASE_HOLDER = f"""
DELETE FROM esdlock_holder
WHERE node_id IN {_SQLITE_IDS} AND holder_id = %(holder_id)s AND (%(owner_key)s IS NULL OR owner_key = %(owner_key)s)
"""
    EVICT_EXPIRED_ON = f"""
DELETE FROM esdlock_holder WHERE node_id IN {_SQLITE_IDS} AND intent IS NULL AND expires_at <= %(cutoff)s
"""
    DELETE_EMPTY_NODES = f"""
DELETE FROM esdlock_node
WHERE id IN {_SQLITE_IDS} AND NOT EXISTS (SELECT 1 FROM esdlock_holder h WHERE h.node_id = esdlock_node.id)
"""
    RENEW = f"""
UPDATE esdlock_holder
SET expires_at = {_SQLITE_TIME}, token = %(token)s, checkpoint = COALESCE(%(checkpoint)s, checkpoint),
    recovery = COALESCE(%(recovery)s, recovery)
WHERE node_id IN {_SQLITE_IDS} AND holder_id = %(holder_id)s AND owner_key = %(owner_key)s
  AND expires_at > %(now)s
"""
    TAKE_OVER_ARBITER = """
SELECT 1 FROM esdlock_holder
WHERE node_id = %(arbiter)s AND holder_id = %(holder_id)s
  AND (%(expected_owner_key)s IS NULL OR owner_key = %(expected_owner_key)s)
  AND (expires_at <= %(now)s OR NOT %(require_expired)s)
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
{_sqlite_ms("h.acquired_at")}, {_sqlite_ms("h.expires_at")}, h.intent, h.checkpoint, h.recovery
"""
    NODE_ORDER = "n.namespace, n.kind, n.key"
    PAGE = _page(RECORD_COLUMNS, NODE_ORDER, "h.holder_id")
    AFTER = "(n.namespace, n.kind, n.key) > (%(after_namespace)s, %(after_kind)s, %(after_key)s)"
    NODE_FILTERS = {
        "namespace": "n.namespace = %(namespace)s",
        "path_prefix": "substr(n.key, 1, %(prefix_length)s) = %(path_prefix)s",
        "top_level": "n.kind = 'tree' AND n.depth = 1",
        "parent": "n.kind = 'tree' AND n.parent = %(parent)s",
    }
    HOLDER_FILTERS = {
        "mode": "h.mode = %(mode)s",
        "host": "json_extract(h.owner, '$.host') = %(host)s",
        "expired": "h.expires_at <= %(now)s",
        "live": "h.expires_at > %(now)s",
        "holder_id": "h.holder_id = %(holder_id)s",
        "node_id": "h.node_id = %(node_id)s",
        "on_nodes": f"h.node_id IN {_SQLITE_IDS}",
        "evictable": "h.intent IS NULL AND h.expires_at <= %(cutoff)s",
        "awaiting_recovery": "h.intent IS NOT NULL AND h.expires_at <= %(cutoff)s",
    }
    RECORDS = _records(RECORD_COLUMNS, NODE_ORDER, "h.holder_id")
