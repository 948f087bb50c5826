"""The plain records that pass between the lock API and the backends."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import functools
import hashlib
import os
import socket
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .modes import Mode, is_grant

MAX_NODE_ID_BYTES = 512
"""Elasticsearch's ``_id`` limit; longer node ids are replaced by a digest."""


class Kind(enum.StrEnum):
    """Which scheme of the chapter a node belongs to."""

    TREE = "tree"
    DOCUMENT = "doc"
    GLOBAL = "global"
    SEMAPHORE = "sem"
    """A counting lock: at most its limit of holders at once (the stores' ``kind`` columns keep 8 characters)."""


@dataclasses.dataclass(frozen=True, order=True)
class Node:
    """One lockable thing: a tree path, a document id or a global lock name."""

    namespace: str
    kind: Kind
    key: str

    @functools.cached_property
    def id(self) -> str:
        """Return the store key of this node, a digest when the key is too long (computed once: a hot path)."""
        plain = f"{self.kind.value}:{self.namespace}:{self.key}"
        if len(plain.encode()) <= MAX_NODE_ID_BYTES:
            return plain
        return "sha256:" + hashlib.sha256(plain.encode()).hexdigest()

    def __str__(self) -> str:
        return f"{self.namespace}:{self.key}" if self.kind is Kind.TREE else f"{self.namespace}:{self.kind}:{self.key}"

    def as_dict(self) -> dict[str, str]:
        """The node's fields in JSON views (``reap_locks --json``, the admin)."""
        return {"namespace": self.namespace, "kind": self.kind.value, "path": self.key}

    @classmethod
    def from_id(cls, node_id: str) -> Node | None:
        """Return the node a store key names, or None for a digest (the key is not in it)."""
        kind, _, rest = node_id.partition(":")
        namespace, _, key = rest.partition(":")
        if kind not in {k.value for k in Kind} or not key:
            return None
        return cls(namespace, Kind(kind), key)


def process_start(pid: int | str = "self") -> str | None:
    """Return what tells this run of ``pid`` from a later process with the same pid.

    On Linux: the boot id and the process's start time in clock ticks, read
    from /proc; None where /proc is missing or the process is gone.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = f.read().rsplit(")", 1)[1].split()[19]  # field 22, starttime
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except (OSError, IndexError):
        return None
    return f"{boot}/{ticks}"


def pid_namespace() -> str | None:
    """Return what names this process's pid namespace on this host, or None where it cannot be read.

    Pids mean something only within their namespace: a container (even one
    that shares the host's name and network) numbers its processes apart.
    On Linux: the boot id and the inode of ``/proc/self/ns/pid`` (a
    namespace's inode is unique among the namespaces alive on one boot).
    """
    try:
        inode = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        try:  # a stat may be refused where the link still reads: "pid:[4026531836]"
            inode = int(os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]"))
        except (OSError, ValueError):
            return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return None
    return f"{boot}/{inode}"


# A fresh id per process, so that pid reuse and fork never confuse two owners.
_process_id = uuid.uuid4().hex
_process_start = process_start()
_pid_namespace = pid_namespace()


def _after_fork() -> None:
    global _process_id, _process_start, _pid_namespace
    _process_id = uuid.uuid4().hex
    _process_start = process_start()
    _pid_namespace = pid_namespace()  # unshare(CLONE_NEWPID) takes effect in children: re-read


os.register_at_fork(after_in_child=_after_fork)


def current_task() -> asyncio.Task[Any] | None:
    """Return the asyncio task running in this thread, or None outside one."""
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop runs in this thread
        return None


@dataclasses.dataclass(frozen=True)
class Owner:
    """The thread, or the asyncio task, that holds a lock, as the store records it."""

    host: str
    pid: int
    thread: int
    thread_name: str
    process: str
    started: str | None = None
    """The process's start identity (:func:`process_start`), to detect a reused pid."""
    task: int | None = None
    """The asyncio task within the thread (its ``id()``): two tasks of one thread are two owners."""
    pidns: str | None = None
    """The pid namespace the pid counts in (:func:`pid_namespace`): a pid is looked up only in its own."""

    @classmethod
    def current(cls) -> Owner:
        thread = threading.current_thread()
        task = current_task()
        name = thread.name if task is None else f"{thread.name} {task.get_name()}"
        return cls(
            socket.gethostname(),
            os.getpid(),
            threading.get_ident(),
            name,
            _process_id,
            _process_start,
            None if task is None else id(task),
            _pid_namespace,
        )

    @property
    def key(self) -> str:
        """Return the identity that makes two acquisitions "the same owner"."""
        return f"{self.process}/{self.thread}" + ("" if self.task is None else f"/{self.task}")

    def as_dict(self) -> dict[str, Any]:
        # thread idents exceed what some stores keep as a number: record text. The task
        # is in the key and the thread name (the stores' owner fields stay as they are).
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "task"}  # flat
        return {**fields, "thread": str(self.thread), "key": self.key}


Targets = tuple[tuple[Node, Mode], ...]
"""What a lock takes: each node with its mode."""


@dataclasses.dataclass(frozen=True)
class LockRequest:
    """Take every (node, mode) of ``targets`` for one holder, all or nothing."""

    holder_id: str
    owner: Owner
    targets: tuple[tuple[Node, Mode], ...]
    ttl: float
    intent: Mapping[str, Any] | None = None
    reentrant: bool = False
    """Document locks: a node this owner already holds in the same mode counts as taken (see ``reentered``)."""
    reentered: frozenset[Node] | None = None
    """Of a reentrant request, the nodes that may count as taken that way: those a lock of the asking thread or
    task holds. An entry of this owner on any other node (a release that never reached the store) is a holder
    like any other. None: every node (a request made outside a lock, as tests and tools make them)."""
    ticket: int | None = None
    """Queue position (when the request started, ns) of a request that may wait; None: it never queues.

    A refused request with a ticket leaves a waiting marker on the nodes that
    refused it; markers with a smaller ticket refuse it, so later requests
    queue behind it. Tickets only order waiters, so clock skew between hosts
    costs fairness at worst, never safety; a request without a ticket
    (``timeout=0``) is refused by every marker in a conflicting mode.
    """
    holds_others: bool = False
    """The owner held other locks when it asked. Only then can a deadlock run through its markers, which
    must name it; an owner that holds nothing waits for this request alone, and the request stands for it."""
    holder_limit: int | None = None
    """A semaphore's limit: its one node takes a holder only while fewer than this many hold it or queue before
    it. The limit its holders were granted under stands while any holds (``Grant.holder_limit``). None: a lock."""

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))

    def may_reenter(self, node: Node) -> bool:
        """Return True if the store may count ``node`` as taken when this owner holds it in the asked mode."""
        return self.reentrant and (self.reentered is None or node in self.reentered)


@dataclasses.dataclass(frozen=True)
class Grant:
    """What the store gave a request: a fencing token and the nodes it wrote."""

    request: LockRequest
    token: int
    taken: tuple[Node, ...]
    holder_limit: int | None = None
    """Of a semaphore's grant, the limit that stands on its node: the request's, unless holders granted under
    another one held it already (then theirs)."""


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
    recovery: Mapping[str, Any] | None = None
    """Set once a reaper took the holder over: state, attempts, last error."""
    holder_limit: int | None = None
    """Of a semaphore's holder: the limit that stands on its node (see ``LockRequest.holder_limit``)."""

    @property
    def owner_key(self) -> str:
        """The owner's identity (:attr:`Owner.key`); a stand-in unique to the holder if the store has none."""
        return owner_key(self.owner, self.holder_id)

    @property
    def expired(self) -> bool:
        """Whether the lease has run out by this host's clock (for display; stores judge by theirs)."""
        return self.expires_at <= datetime.datetime.now(datetime.UTC)

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-ready view, as ``reap_locks --json`` and the admin show it."""
        return {
            **self.node.as_dict(),
            "mode": self.mode.value,
            "holder_id": self.holder_id,
            "owner": dict(self.owner),
            "token": self.token,
            "acquired_at": self.acquired_at.isoformat() if self.acquired_at else None,
            "expires_at": self.expires_at.isoformat(),
            "intent": self.intent,
            "checkpoint": self.checkpoint,
            "recovery": self.recovery,
            **({} if self.holder_limit is None else {"holder_limit": self.holder_limit}),
        }


@dataclasses.dataclass(frozen=True)
class WaiterRecord:
    """One waiting marker: request ``holder_id`` of ``owner`` waits for ``mode`` on ``node``."""

    node: Node
    mode: Mode
    holder_id: str
    owner: Mapping[str, Any]
    """Who waits: the owner's fields as holders record them; on Elasticsearch, whose markers are kept small,
    ``host``, ``pid``, ``thread_name`` and, when it held other locks, ``key``. Empty for a marker of an older
    release."""
    ticket: int
    """The request's queue position: when it started, in ns since the epoch (the waiting host's clock)."""
    expires_at: datetime.datetime

    @property
    def owner_key(self) -> str:
        return owner_key(self.owner, self.holder_id)

    @property
    def since(self) -> datetime.datetime:
        """When the request began to wait (from its ticket)."""
        return datetime.datetime.fromtimestamp(self.ticket / 1e9, tz=datetime.UTC)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.node.as_dict(),
            "mode": self.mode.value,
            "holder_id": self.holder_id,
            "owner": dict(self.owner),
            "since": self.since.isoformat(),
            "expires_at": self.expires_at.isoformat(),
        }


@dataclasses.dataclass(frozen=True)
class WaitState:
    """What a wait-for graph is built from, read by the store's clock.

    ``waiters``: live waiting markers. ``holders``: the holders that block
    (live, or expired with an intent awaiting recovery) of the nodes those
    markers are on.
    """

    waiters: tuple[WaiterRecord, ...]
    holders: tuple[HolderRecord, ...]


def owner_key(owner: Mapping[str, Any], holder_id: str) -> str:
    """The key of a recorded owner, or a stand-in unique to ``holder_id`` (no two such records are one owner)."""
    return str(owner.get("key") or f"?{holder_id}")


def main_record(records: Sequence[HolderRecord]) -> HolderRecord:
    """Return the record of the node a holder meant to lock (its S or X node), else its last one."""
    return next((r for r in records if is_grant(r.mode)), records[-1])


@dataclasses.dataclass(frozen=True)
class HolderPage:
    """One page of holders and the cursor of the next page (None at the end)."""

    holders: list[HolderRecord]
    next_cursor: str | None


def from_epoch_ms(value: int | float | None) -> datetime.datetime | None:
    if value is None:
        return None
    return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
