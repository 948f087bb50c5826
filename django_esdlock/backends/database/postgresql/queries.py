"""The statements of the PostgreSQL dialect, and the names they share with its functions and sessions.

Rules every statement here keeps besides those of the functions (``functions.py``):

- values come only as parameters, never formatted into the text; a statement
  is a constant, or is assembled from constant fragments (listing filters);
- expiry is judged by the database's clock (``statement_timestamp()``);
- a statement that changes a grant re-checks on the row it changes what it
  read (owner, lease), so a concurrent renewal, release or takeover is never
  overwritten by a decision taken on an older version of the row;
- node rows are locked in bytewise id order, grant rows in bytewise holder id
  order, node rows before grant rows (the reaper, which locks grants first,
  skips node rows that are locked): no two transactions wait on each other
  in a cycle.
"""

from __future__ import annotations

from ..queries import page_query, records_query

TOKEN_SEQUENCE = "esdlock_token_seq"
"""The sequence fencing tokens come from."""

SETUP_LOCK_KEY = 0x65_73_64_6C_6F_63_6B
"""Advisory lock key that serializes concurrent ``setup()`` calls ("esdlock")."""

CHANNEL_PREFIX = "esdlock_"
"""A waiting session listens on ``esdlock_<its backend pid>``; its markers name that channel."""

CLIENT_CHECK_SINCE = 140000

# Which held modes conflict with each mode: passed to esdlock_release, which
_MS = "%(ttl_ms)s::float8 * interval '1 millisecond'"

# The holders of node `n`: one row per entry whose grant still exists.
_HOLDERS_OF_N = """(
    SELECT n.id AS node_id, e.key AS holder_id, e.value AS mode, g.owner, g.owner_key, g.token, g.acquired_at,
           g.expires_at, g.intent, g.checkpoint, g.recovery
    FROM jsonb_each_text(coalesce(n.entries, '{}'::jsonb)) AS e JOIN esdlock_grant g ON g.holder_id = e.key
) h"""

_EVICTABLE = (
    "h.intent IS NULL AND h.expires_at <= statement_timestamp() - %(grace_ms)s::float8 * interval '1 millisecond'"
)
_AWAITING = (
    "h.intent IS NOT NULL AND h.expires_at <= statement_timestamp() - %(grace_ms)s::float8 * interval '1 millisecond'"
)


class PostgresSQL:
    """Statements for PostgreSQL (psycopg), run in autocommit or at READ COMMITTED on the lock connection."""

    BEGIN = "BEGIN"

    # The standbys of the database the session is on, and what makes a commit wait for them. A role without
    # pg_read_all_stats (or superuser) sees each standby's row but not its state: sync_state is NULL then.
    STANDBYS = """
SELECT application_name, sync_state, current_setting('synchronous_standby_names'), current_setting('synchronous_commit')
FROM pg_stat_replication
"""

    # A frozen client must not keep node rows locked for ever, nor make
    # acquirers queue behind it without end: both fail after a while instead.
    SESSION = """
SELECT set_config('lock_timeout', '10s', false), set_config('idle_in_transaction_session_timeout', '30s', false)
"""
    # A session whose client has gone while it waits for node rows stops
    # waiting (PostgreSQL 14+ notices within a second) instead of queueing
    # for rows it would take for nobody.
    SESSION_CLIENT_CHECK = "SELECT set_config('client_connection_check_interval', '1s', false)"

    # One autocommit call: the grant is committed when the answer is sent. A
    # client that loses the answer releases the holder id best-effort; one
    # that dies leaves a grant its lease ends, like any dead holder.
    ACQUIRE = """
SELECT token, taken, holder_limit FROM esdlock_acquire(
    %(ids)s::text[], %(namespaces)s::text[], %(kinds)s::text[], %(keys)s::text[], %(parents)s::text[],
    %(depths)s::int[], %(modes)s::text[], %(conflicts)s::text[], %(holder_id)s::text, %(owner)s::jsonb,
    %(owner_key)s::text, %(ttl_ms)s::float8, %(intent)s::jsonb, %(reentrant)s::text[], %(ticket)s::bigint,
    %(marker_ttl_ms)s::float8, %(lock_delay_ms)s::float8, %(holder_limit)s::int)
"""
    RELEASE = "SELECT esdlock_release(%(holder_id)s::text, %(owner_key)s::text, %(conflicts)s::jsonb)"

    # A request that gave up takes its markers away and wakes the waiters
    # queued behind them on those nodes (they may go first now).
    WITHDRAW = """
WITH gone AS (
    DELETE FROM esdlock_waiter WHERE node_id = ANY(%(ids)s::text[]) AND holder_id = %(holder_id)s::text
    RETURNING node_id
)
SELECT pg_notify(c.channel, c.holder_id) FROM (
    SELECT DISTINCT w.channel, w.holder_id FROM esdlock_waiter w
    WHERE w.node_id IN (SELECT node_id FROM gone) AND w.holder_id <> %(holder_id)s::text
      AND w.channel <> '' AND w.expires_at > statement_timestamp()
) c
"""
    DROP_EXPIRED_MARKERS = "DELETE FROM esdlock_waiter WHERE expires_at <= statement_timestamp()"

    # The sequence only moves up to the floor, never down (after a restore rewound it).
    RAISE_TOKEN_FLOOR = f"""
SELECT setval('{TOKEN_SEQUENCE}', %(floor)s::bigint) WHERE (SELECT last_value FROM {TOKEN_SEQUENCE}) < %(floor)s::bigint
"""

    # Creating the tables: one process at a time (``setup``).
    SETUP_LOCK = "SELECT pg_advisory_lock(%s)"
    SETUP_UNLOCK = "SELECT pg_advisory_unlock(%s)"

    # An async session's markers name the channel of its loop's listening session.
    SET_CHANNEL = "SELECT set_config('esdlock.channel', %s, false)"

    LISTEN = "LISTEN {channel}"  # an identifier: formatted from the backend pid, never from user data

    # Extend the lease of a live grant of this owner from the database's now;
    # an expired lease is never revived, a taken-over grant is not ours. The
    # one row is the whole holder, whatever the number of its nodes.
    RENEW = f"""
UPDATE esdlock_grant
SET expires_at = statement_timestamp() + {_MS}, token = %(token)s,
    checkpoint = COALESCE(%(checkpoint)s::jsonb, checkpoint), recovery = COALESCE(%(recovery)s::jsonb, recovery)
WHERE holder_id = %(holder_id)s::text AND owner_key = %(owner_key)s::text AND expires_at > statement_timestamp()
"""

    # RENEW for many grants at once, without checkpoint or recovery (the
    # renewer's): one statement whatever their number; returns the holder ids
    # it renewed. Only live grants are updated, so rows the reaper locks
    # (expired ones) are never waited for.
    RENEW_MANY = """
UPDATE esdlock_grant g
SET expires_at = statement_timestamp() + r.ttl_ms * interval '1 millisecond', token = r.token
FROM unnest(%(holder_ids)s::text[], %(owner_keys)s::text[], %(ttl_ms)s::float8[], %(tokens)s::bigint[])
    AS r(holder_id, owner_key, ttl_ms, token)
WHERE g.holder_id = r.holder_id AND g.owner_key = r.owner_key AND g.expires_at > statement_timestamp()
RETURNING g.holder_id
"""

    # A bounded call (a renewal) sets the session's statement_timeout; the
    # next unbounded call gives it back its configured value.
    SET_STATEMENT_TIMEOUT = "SELECT set_config('statement_timeout', %s::text, false)"
    RESET_STATEMENT_TIMEOUT = "RESET statement_timeout"

    # Hand a grant to a new owner with a new token and lease, if it still has
    # the owner it was read with and, when required, has expired (a reaper)
    # or is still live (a hand-off's claim), or still has the lease it was read
    # with (a forced release; as RECORD_COLUMNS reads it): of callers racing for it, the
    # first to update the row wins and the others find the owner changed (the
    # condition is re-checked on the row they waited for). Intent and
    # checkpoint stay. Returns the token and nodes.
    TAKE_OVER = f"""
UPDATE esdlock_grant g
SET owner = %(owner)s::jsonb, owner_key = %(owner_key)s::text, token = nextval('{TOKEN_SEQUENCE}'),
    recovery = %(recovery)s::jsonb, expires_at = statement_timestamp() + {_MS}
WHERE g.holder_id = %(holder_id)s::text
  AND (%(expected_owner_key)s::text IS NULL OR g.owner_key = %(expected_owner_key)s::text)
  AND (g.expires_at <= statement_timestamp() OR NOT %(require_expired)s::boolean)
  AND (g.expires_at > statement_timestamp() OR NOT %(require_live)s::boolean)
  AND (%(expected_expires_ms)s::bigint IS NULL
       OR (extract(epoch FROM g.expires_at) * 1000)::bigint = %(expected_expires_ms)s::bigint)
RETURNING g.token, ARRAY(SELECT jsonb_object_keys(g.nodes))
"""

    # Live waiting markers, of some nodes or all, with their nodes (a row may be gone: the id names it).
    WAITERS = """
SELECT w.node_id, n.namespace, n.kind, n.key, w.holder_id, w.mode, w.ticket,
       (extract(epoch FROM w.expires_at) * 1000)::bigint, w.owner::text
FROM esdlock_waiter w LEFT JOIN esdlock_node n ON n.id = w.node_id
WHERE w.expires_at > statement_timestamp() AND (%(all)s::boolean OR w.node_id = ANY(%(ids)s::text[]))
ORDER BY w.node_id COLLATE "C", w.ticket
"""

    # What a HolderRecord is made of, from holder `h` and node `n`.
    RECORD_COLUMNS = """
n.namespace, n.kind, n.key, h.node_id, h.holder_id, h.mode, h.owner::text, h.token,
(extract(epoch FROM h.acquired_at) * 1000)::bigint, (extract(epoch FROM h.expires_at) * 1000)::bigint,
h.intent::text, h.checkpoint::text, h.recovery::text, n.holder_limit
"""
    # Nodes ordered bytewise by namespace, kind and key, as Elasticsearch sorts keywords.
    NODE_ORDER = 'n.namespace COLLATE "C", n.kind COLLATE "C", n.key COLLATE "C"'
    PAGE = page_query(
        RECORD_COLUMNS,
        NODE_ORDER,
        'h.holder_id COLLATE "C"',
        node_columns="n.id, n.namespace, n.kind, n.key, n.entries, n.holder_limit",
        holders_join=f"CROSS JOIN LATERAL {_HOLDERS_OF_N}",
        holders_of_n=f"{_HOLDERS_OF_N} WHERE",
    )
    AFTER = (
        '(n.namespace COLLATE "C", n.kind COLLATE "C", n.key COLLATE "C")'
        " > (%(after_namespace)s::text, %(after_kind)s::text, %(after_key)s::text)"
    )
    # Grants are found from their own table when a filter names them, not by
    # reading every node row's entries.
    _NODES_OF_GRANTS = "n.id IN (SELECT jsonb_object_keys(h.nodes) FROM esdlock_grant h WHERE {})"
    NODE_FILTERS = {
        "namespace": "n.namespace = %(namespace)s::text",
        "path_prefix": "left(n.key, %(prefix_length)s::int) = %(path_prefix)s::text",
        "top_level": "n.kind = 'tree' AND n.depth = 1",
        "parent": "n.kind = 'tree' AND n.parent = %(parent)s::text",
        "node": "n.id = %(node_id)s::text",
        "on_nodes": "n.id = ANY(%(ids)s::text[])",
        "holder": _NODES_OF_GRANTS.format("h.holder_id = %(holder_id)s::text"),
        "evictable": _NODES_OF_GRANTS.format(_EVICTABLE),
        "awaiting_recovery": _NODES_OF_GRANTS.format(_AWAITING),
    }
    HOLDER_FILTERS = {
        "mode": "h.mode = %(mode)s::text",
        "host": "h.owner->>'host' = %(host)s::text",
        "expired": "h.expires_at <= statement_timestamp()",
        "live": "h.expires_at > statement_timestamp()",
        "blocking": "(h.expires_at > statement_timestamp() OR h.intent IS NOT NULL)",
        "holder_id": "h.holder_id = %(holder_id)s::text",
        "node_id": "h.node_id = %(node_id)s::text",
        "evictable": _EVICTABLE,
        "awaiting_recovery": _AWAITING,
    }
    # Every matching holder at once (one holder's, one node's, the few awaiting recovery).
    RECORDS = records_query(
        RECORD_COLUMNS, NODE_ORDER, 'h.holder_id COLLATE "C"', holders_join=f"CROSS JOIN LATERAL {_HOLDERS_OF_N}"
    )

    # The reaper: lock the evictable grants among these holder ids (in holder
    # id order), then delete those still evictable on the row and return
    # their records, node by node.
    LOCK_GRANTS = """
SELECT holder_id FROM esdlock_grant WHERE holder_id = ANY(%(holder_ids)s::text[])
ORDER BY holder_id COLLATE "C" FOR UPDATE
"""
    EVICT = f"""
WITH gone AS (
    DELETE FROM esdlock_grant h
    WHERE h.holder_id = ANY(%(holder_ids)s::text[]) AND {_EVICTABLE}
    RETURNING h.*
), h AS (
    SELECT e.key AS node_id, g.holder_id, e.value AS mode, g.owner, g.owner_key, g.token, g.acquired_at,
           g.expires_at, g.intent, g.checkpoint, g.recovery
    FROM gone g CROSS JOIN LATERAL jsonb_each_text(g.nodes) AS e
)
SELECT {RECORD_COLUMNS} FROM h JOIN esdlock_node n ON n.id = h.node_id ORDER BY {NODE_ORDER}, h.holder_id
"""
    # The reaper's pages: the next evictable grants in holder id order (a
    # walk of the primary key), then their records node by node, only those
    # in the namespace asked for, if any.
    EVICTABLE_PAGE = f"""
SELECT h.holder_id FROM esdlock_grant h WHERE {_EVICTABLE} AND h.holder_id > %(after)s::text
ORDER BY h.holder_id LIMIT %(limit)s
"""
    GRANT_RECORDS = f"""
WITH h AS (
    SELECT e.key AS node_id, g.holder_id, e.value AS mode, g.owner, g.owner_key, g.token, g.acquired_at,
           g.expires_at, g.intent, g.checkpoint, g.recovery
    FROM esdlock_grant g CROSS JOIN LATERAL jsonb_each_text(g.nodes) AS e
    WHERE g.holder_id = ANY(%(holder_ids)s::text[])
)
SELECT {RECORD_COLUMNS} FROM h JOIN esdlock_node n ON n.id = h.node_id
WHERE %(namespace)s::text IS NULL OR n.namespace = %(namespace)s::text
ORDER BY h.holder_id, {NODE_ORDER}
"""
    # Idle node rows (no entry whose grant exists) go in two statements: lock
    # a page of candidates (primary key order), skipping rows an acquisition
    # holds; then, with a snapshot taken after those locks, delete the ones
    # still idle.
    LOCK_IDLE_NODES = """
SELECT n.id FROM esdlock_node n WHERE n.id > %(after)s::text ORDER BY n.id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
"""
    DELETE_IDLE_NODES = """
DELETE FROM esdlock_node n
WHERE n.id = ANY(%(ids)s::text[]) AND NOT EXISTS (
    SELECT 1 FROM jsonb_object_keys(coalesce(n.entries, '{}'::jsonb)) AS e(holder_id)
    JOIN esdlock_grant g ON g.holder_id = e.holder_id
)
"""
