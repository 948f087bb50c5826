"""The plain records that pass between the lock API and the backends."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
import os
import socket
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from .modes import Mode

MAX_NODE_ID_BYTES = 512
"""Elasticsearch's ``_id`` limit; longer node ids are replaced by a digest."""


class Kind(str, enum.Enum):
    """Which scheme of the chapter a node belongs to."""

    TREE = "tree"
    DOCUMENT = "doc"
    GLOBAL = "global"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True, order=True)
class Node:
    """One lockable thing: a tree path, a document id or a global lock name."""

    namespace: str
    kind: Kind
    key: str

    @property
    def id(self) -> str:
        """Return the store key of this node, a digest when the key is too long."""
        plain = f"{self.kind.value}:{self.namespace}:{self.key}"
        if len(plain.encode()) <= MAX_NODE_ID_BYTES:
            return plain
        return "sha256:" + hashlib.sha256(plain.encode()).hexdigest()

    def __str__(self) -> str:
        return f"{self.namespace}:{self.key}" if self.kind is Kind.TREE else f"{self.namespace}:{self.kind}:{self.key}"


# A fresh id per process, so that pid reuse and fork never confuse two owners.
_process_id = uuid.uuid4().hex


def _new_process_id() -> None:
    global _process_id
    _process_id = uuid.uuid4().hex


os.register_at_fork(after_in_child=_new_process_id)


@dataclasses.dataclass(frozen=True)
class Owner:
    """The thread that holds a lock, as the store records it."""

    host: str
    pid: int
    thread: int
    thread_name: str
    process: str

    @classmethod
    def current(cls) -> Owner:
        thread = threading.current_thread()
        return cls(socket.gethostname(), os.getpid(), threading.get_ident(), thread.name, _process_id)

    @property
    def key(self) -> str:
        """Return the identity that makes two acquisitions "the same owner"."""
        return f"{self.process}/{self.thread}"

    def as_dict(self) -> dict[str, Any]:
        # thread idents exceed what some stores keep as a number: record text
        return {**dataclasses.asdict(self), "thread": str(self.thread), "key": self.key}


@dataclasses.dataclass(frozen=True)
class LockRequest:
    """Take every (node, mode) of ``targets`` for one holder, all or nothing."""

    holder_id: str
    owner: Owner
    targets: tuple[tuple[Node, Mode], ...]
    ttl: float
    intent: Mapping[str, Any] | None = None
    reentrant: bool = False
    """Document locks: a node this owner already holds in the same mode counts as taken."""

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))


@dataclasses.dataclass(frozen=True)
class Grant:
    """What the store gave a request: a fencing token and the nodes it wrote."""

    request: LockRequest
    token: int
    taken: tuple[Node, ...]


@dataclasses.dataclass(frozen=True)
class HolderRecord:
    """One holder of one node, as a backend lists it."""

    node: Node
    mode: Mode
    holder_id: str
    owner: Mapping[str, Any]
    token: int | None
    acquired_at: datetime.datetime | None
    expires_at: datetime.datetime
    intent: Mapping[str, Any] | None = None
    checkpoint: Mapping[str, Any] | None = None

    @property
    def expired(self) -> bool:
        return self.expires_at <= datetime.datetime.now(datetime.timezone.utc)


@dataclasses.dataclass(frozen=True)
class HolderPage:
    """One page of holders and the cursor of the next page (None at the end)."""

    holders: list[HolderRecord]
    next_cursor: str | None


def from_epoch_ms(value: int | float | None) -> datetime.datetime | None:
    if value is None:
        return None
    return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.timezone.utc)
