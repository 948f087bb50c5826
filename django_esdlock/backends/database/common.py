"""What the SQL dialects of the database lock backend share: the dialect interface, listing templates, row codecs."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ... import paths
from ...modes import Mode, is_grant
from ...records import Grant, HolderRecord, Kind, LockRequest, Node, Owner, WaiterRecord, from_epoch_ms

Work = tuple[Any, bool]
"""What a unit of work on a cursor returns: its value, and whether to commit (inside a transaction)."""


def page_query(
    record_columns: str, node_order: str, holder_order: str, *, node_columns: str, holders_join: str, holders_of_n: str
) -> str:
    """Pages of nodes that have a holder matching {holders}, with those holders, in node then holder order.

    ``{nodes}`` and ``{holders}`` stay in the text, filled later with joined
    constant fragments. ``holders_join`` joins node ``n`` to its holders
    ``h`` (one row per node and holder); ``holders_of_n`` is the same as a
    FROM list and WHERE start for an EXISTS; the orders differ per database
    only in collation.
    """
    return f"""
WITH page AS (
    SELECT {node_columns} FROM esdlock_node n
    WHERE {{nodes}} AND EXISTS (SELECT 1 FROM {holders_of_n} {{holders}})
    ORDER BY {node_order}
    LIMIT %(limit)s
)
SELECT {record_columns} FROM page n {holders_join}
WHERE {{holders}}
ORDER BY {node_order}, {holder_order}
"""


def records_query(record_columns: str, node_order: str, holder_order: str, *, holders_join: str) -> str:
    """Every holder matching {nodes} and {holders} at once, in the order of :func:`page_query`."""
    return f"""
SELECT {record_columns} FROM esdlock_node n {holders_join}
WHERE {{nodes}} AND {{holders}}
ORDER BY {node_order}, {holder_order}
"""


class Dialect:
    """One database's SQL and quirks; the shared backend calls these and never tests the vendor.

    Methods named after a backend operation take a cursor on the lock
    connection and return ``(value, commit)`` (see :data:`Work`): inside a
    transaction when :attr:`atomic_calls` is false, in autocommit otherwise.
    """

    vendor: ClassVar[str]
    atomic_calls: ClassVar[bool] = False
    """Whether acquire, release, renew and takeover are one autocommit statement each (no BEGIN/COMMIT)."""

    supports_notify: ClassVar[bool] = False

    evicts_by_grant: ClassVar[bool] = False
    """Whether the reaper pages through grants (:meth:`find_evictable`) rather than through nodes."""

    BEGIN: ClassVar[str]
    COMMIT: ClassVar[str] = "COMMIT"
    ROLLBACK: ClassVar[str] = "ROLLBACK"
    CHECK: ClassVar[str] = "SELECT 1"
    PAGE: ClassVar[str]
    RECORDS: ClassVar[str]
    AFTER: ClassVar[str]
    NODE_FILTERS: ClassVar[dict[str, str]]
    HOLDER_FILTERS: ClassVar[dict[str, str]]

    def connection_options(self, options: dict[str, Any], ttl: float) -> dict[str, Any]:
        """Return the OPTIONS of a lock connection, given those of the configured database and the TTL."""
        return options

    def call_timeout(self, wrapper: Any, cursor: Any, ms: int | None) -> None:
        """Bound the calls on this connection to ``ms`` milliseconds from now on (None: lift the bound)."""

    def prepare(self, wrapper: Any, cursor: Any) -> None:
        """Set up a new connection for lock work."""

    def with_clock(self, cursor: Any, params: dict[str, Any]) -> dict[str, Any]:
        """Return ``params`` plus what the listing filters need of the database's clock."""
        return params

    def is_missing_schema(self, error: BaseException) -> bool:
        raise NotImplementedError

    def acquire(self, cursor: Any, request: LockRequest, nodes: list[Node], marker_ttl_ms: int) -> Work:
        raise NotImplementedError

    def release(
        self, cursor: Any, holder_id: str, owner_key: str | None, released: Sequence[tuple[Node, Mode | None]]
    ) -> Work:
        raise NotImplementedError

    def withdraw(self, cursor: Any, request: LockRequest) -> Work:
        raise NotImplementedError

    def renew(self, cursor: Any, grant: Grant, checkpoint: str | None, recovery: str | None) -> Work:
        raise NotImplementedError

    def renew_many(self, cursor: Any, grants: Sequence[Grant]) -> Work:
        """Return ``([renewed, per grant], commit)``: one after another, in the one transaction of the call."""
        return [self.renew(cursor, grant, None, None)[0] for grant in grants], True

    def take_over(self, cursor: Any, ids: list[str], params: dict[str, Any]) -> Work:
        """Return ``((token, taken node ids) or None, commit)``."""
        raise NotImplementedError

    def evict(self, cursor: Any, rows: list[Sequence[Any]], grace_ms: int) -> Work:
        """Remove the evictable holders among the page ``rows``; return their records."""
        raise NotImplementedError

    def find_evictable(
        self, cursor: Any, namespace: str | None, grace_ms: int, after: str, limit: int
    ) -> tuple[tuple[list[Sequence[Any]], list[str]], bool]:
        """Return the records of the next ``limit`` evictable grants after holder id ``after``, and their ids."""
        raise NotImplementedError

    def drop_expired_markers(self, cursor: Any) -> Work:
        raise NotImplementedError

    def wait_state(self, cursor: Any, ids: list[str] | None) -> Work:
        """Return ``((live marker rows, blocking holder rows), commit)``: of nodes ``ids``, or of every marker.

        Marker rows are ``WAITER_COLUMNS``; holder rows ``RECORD_COLUMNS``, of
        the holders (live, or awaiting recovery) on the markers' nodes.
        """
        raise NotImplementedError

    def raise_token_floor(self, cursor: Any, floor: int) -> Work:
        """Make the token counter give only tokens above ``floor`` (never lower it); return whether it moved."""
        raise NotImplementedError

    def drop_idle_nodes(self, cursor: Any, after: str, limit: int) -> Work:
        """Delete node rows that no grant holds, among the next ``limit`` after id ``after``.

        Return ``((rows looked at, last id), commit)``; stores that delete a
        node with its last holder have nothing to do.
        """
        return (0, after), False


def encode_cursor(values: Sequence[str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values)).encode()).decode()


def decode_cursor(cursor: str) -> tuple[str, str, str]:
    try:
        namespace, kind, key = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return str(namespace), str(kind), str(key)
    except (ValueError, TypeError) as e:
        raise ValueError(f"not a holder page cursor: {cursor!r}") from e


def json_text(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _unjson(value: Any) -> Any:
    if value is None or isinstance(value, (dict, list)):
        return value
    return json.loads(value)


def record(row: Sequence[Any]) -> HolderRecord:
    """A HolderRecord from a row of ``RECORD_COLUMNS`` (every dialect selects the same columns).

    Intent and checkpoint belong to the holder's main node (its S or X node):
    the records of its other nodes carry neither, on every store (PostgreSQL
    keeps them once per grant; SQLite rows of an older release had copies).
    """
    namespace, kind, key, _node_id, holder_id, mode, owner, token, acquired_ms, expires_ms, *json_columns = row
    intent, checkpoint, recovery = (_unjson(value) for value in json_columns)
    if not is_grant(mode):
        intent = checkpoint = None
    expires_at = from_epoch_ms(expires_ms)
    assert expires_at is not None
    return HolderRecord(
        node=Node(namespace, Kind(kind), key),
        mode=Mode(mode),
        holder_id=holder_id,
        owner=_unjson(owner) or {},
        token=token,
        acquired_at=from_epoch_ms(acquired_ms),
        expires_at=expires_at,
        intent=intent,
        checkpoint=checkpoint,
        recovery=recovery,
    )


def waiter(row: Sequence[Any]) -> WaiterRecord | None:
    """A WaiterRecord from a row of a dialect's waiter columns; None for a marker whose node cannot be named."""
    node_id, namespace, kind, key, holder_id, mode, ticket, expires_ms, owner = row
    node = Node(namespace, Kind(kind), key) if namespace is not None else Node.from_id(node_id)
    expires_at = from_epoch_ms(expires_ms)
    if node is None or expires_at is None:
        return None  # a digest id whose node row went: it blocks nobody by a holder
    return WaiterRecord(node, Mode(mode), holder_id, _unjson(owner) or {}, int(ticket), expires_at)


def node_row(node: Node) -> tuple[str, str, str, str, str, int]:
    """(id, namespace, kind, key, parent, depth) of a node's row."""
    tree = node.kind is Kind.TREE
    parent = (paths.parent(node.key) or "") if tree else ""
    return node.id, node.namespace, node.kind.value, node.key, parent, node.key.count("/") if tree else 0


def takeover_params(
    arbiter: HolderRecord, owner: Owner, recovery: str | None, ttl_ms: int, require_expired: bool, require_live: bool
) -> dict[str, Any]:
    return {
        "arbiter": arbiter.node.id,
        "holder_id": arbiter.holder_id,
        "expected_owner_key": arbiter.owner.get("key"),
        "require_expired": require_expired,
        "require_live": require_live,
        "owner": json_text(owner.as_dict()),
        "owner_key": owner.key,
        "recovery": recovery,
        "ttl_ms": ttl_ms,
    }
