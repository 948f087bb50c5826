"""The tables of the database lock backend: lock nodes, grants (PostgreSQL) or holders (SQLite), waiting markers."""

from __future__ import annotations

from django.db import models

# The admin's unmanaged model lives in a module of its own; importing it here
# registers it whether or not the admin is installed, so migrations agree.
from .held_lock import HeldLock

__all__ = ["HeldLock", "LockGrant", "LockHolder", "LockNode", "LockWaiter"]


class LockNode(models.Model):
    """A lockable node. Acquisitions lock these rows, in the order of their ids, before they judge or write.

    This row lock is what serializes requests on a node. SQLite deletes the
    row when its last holder leaves. PostgreSQL keeps it between holds (the
    reaper deletes idle ones) and records in ``entries`` which grants hold
    it: holder id → mode, written under the row lock, read by the next
    acquisition; an entry whose grant is gone is dropped when the row is
    next written.
    """

    id = models.CharField(primary_key=True, max_length=512, help_text="Node.id: kind, namespace and key, or a digest")
    namespace = models.CharField(max_length=100)
    kind = models.CharField(max_length=8)
    key = models.TextField()
    parent = models.TextField(blank=True, default="")
    depth = models.PositiveIntegerField(default=0)
    entries = models.JSONField(
        null=True, blank=True, help_text="PostgreSQL: holder id → mode of the grants on this node"
    )
    holder_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="A semaphore's: the limit its holders were granted under"
    )

    class Meta:
        db_table = "esdlock_node"
        verbose_name = "lock node"

    def __str__(self) -> str:
        return f"{self.namespace}:{self.key}"


class HeldRecord(models.Model):
    """What a hold records, whichever table keeps it: owner, lease, fencing token, intent and progress."""

    owner = models.JSONField()
    owner_key = models.CharField(max_length=200)
    token = models.BigIntegerField()
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    intent = models.JSONField(null=True, blank=True)
    checkpoint = models.JSONField(null=True, blank=True)
    recovery = models.JSONField(null=True, blank=True, help_text="Set once a reaper took the holder over")

    class Meta:
        abstract = True


class LockHolder(HeldRecord):
    """SQLite: one holder of one node, a mode, an owner, a lease and a fencing token."""

    node = models.ForeignKey(LockNode, on_delete=models.CASCADE, related_name="holders", db_index=False)
    holder_id = models.CharField(max_length=64)
    mode = models.CharField(max_length=2)

    class Meta:
        db_table = "esdlock_holder"
        verbose_name = "lock holder"
        constraints = [models.UniqueConstraint(fields=["node", "holder_id"], name="esdlock_holder_node_holder_uniq")]
        # Every index is paid for by each acquire and release: only lookups by
        # holder id (the admin's force release) get one besides the unique key.
        indexes = [models.Index(fields=["holder_id"], name="esdlock_holder_holder_id")]

    def __str__(self) -> str:
        return f"{self.holder_id} {self.mode} on {self.node_id}"


class LockGrant(HeldRecord):
    """PostgreSQL: one holder (a grant) of all its nodes: their modes, the owner, lease, token, intent and checkpoint.

    One row per grant, not per node, keeps a lock pair to one row written and
    one deleted whatever the depth; the nodes' ``entries`` point back here.
    """

    holder_id = models.CharField(primary_key=True, max_length=64)
    nodes = models.JSONField(help_text="Node id → mode, for every node this grant holds")

    class Meta:
        db_table = "esdlock_grant"
        verbose_name = "lock grant"

    def __str__(self) -> str:
        return f"{self.holder_id} on {len(self.nodes)} node(s)"


class LockWaiter(models.Model):
    """A waiting marker: a request refused on a node queues later requests behind it (fair waiting).

    A live marker in a mode that conflicts with a request refuses that request
    if it came later (no ticket, or a larger one), unless its owner already
    holds the node. Markers last a short lease, renewed by their request's
    attempts once half of it has passed, and go when it is granted or gives
    up. No foreign key: a marker may outlive its node's row, which a release
    deletes.
    """

    node_id = models.CharField(max_length=512)
    holder_id = models.CharField(max_length=64)
    mode = models.CharField(max_length=2)
    ticket = models.BigIntegerField(help_text="Queue position: when the request started (ns)")
    expires_at = models.DateTimeField()
    channel = models.CharField(
        max_length=63, blank=True, default="", help_text="PostgreSQL: the channel its waiting session listens on"
    )
    owner = models.JSONField(
        null=True, blank=True, help_text="Who waits: the owner fields a holder records (the wait-for graph's edges)"
    )

    class Meta:
        db_table = "esdlock_waiter"
        verbose_name = "waiting marker"
        constraints = [models.UniqueConstraint(fields=["node_id", "holder_id"], name="esdlock_waiter_node_holder_uniq")]

    def __str__(self) -> str:
        return f"{self.holder_id} waits for {self.mode} on {self.node_id}"
