"""What the database dialects read and write alike: records from rows, rows from nodes, page cursors."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ... import paths
from ...modes import Mode, is_grant
from ...records import HolderRecord, Kind, Node, Owner, WaiterRecord, from_epoch_ms


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
    namespace, kind, key, _node_id, holder_id, mode, owner, token, acquired_ms, expires_ms, *rest = row
    intent, checkpoint, recovery = (_unjson(value) for value in rest[:3])
    holder_limit = rest[3] if len(rest) > 3 and kind == Kind.SEMAPHORE.value else None
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
        holder_limit=holder_limit,
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
