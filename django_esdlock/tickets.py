"""Tickets: a held lock handed to another process travels as a signed string (see :mod:`handoff`)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from django.core import signing

from .exceptions import InvalidLockArgument
from .modes import Mode
from .records import Grant, HolderRecord, Kind, Node, Targets

SALT = "django_esdlock.handoff"
"""Signing salt of tickets: a ticket is signed with SECRET_KEY, so a forged or altered one is refused."""

_NEVER = datetime.datetime.fromtimestamp(0, tz=datetime.UTC)


@dataclasses.dataclass(frozen=True)
class Ticket:
    """What a claimant needs to take a handed-off holder over; travels as a signed string."""

    holder_id: str
    owner_key: str
    """The owner that handed it off: the claim succeeds only while the holder still has it."""
    targets: tuple[tuple[Node, Mode], ...]
    token: int
    """The fencing token of the handing process: the claimant's is larger."""
    ttl: float
    """The lease the claimant renews (the handed-off lock's TTL), not the ticket's validity."""
    intent: Mapping[str, Any] | None = None
    checkpoint: Mapping[str, Any] | None = None
    reentrant: bool = False
    held_apart: Targets = ()
    """What the handing lock was asked for but did not take: document ids its owner held under another lock."""

    @classmethod
    def of(cls, grant: Grant, *, ttl: float, checkpoint: Mapping[str, Any] | None) -> Ticket:
        """Return the ticket of a grant (only the nodes it took: a document lock's reentrant ids are not its)."""
        request = grant.request
        modes = dict(request.targets)
        taken = set(grant.taken)
        ticket = cls(
            holder_id=request.holder_id,
            owner_key=request.owner.key,
            targets=tuple((node, modes[node]) for node in grant.taken),
            token=grant.token,
            ttl=ttl,
            intent=request.intent,
            checkpoint=checkpoint,
            reentrant=request.reentrant,
            held_apart=tuple(target for target in request.targets if target[0] not in taken),
        )
        return ticket

    def require_covers(self, targets: Targets, what: str) -> None:
        """Raise InvalidLockArgument unless this ticket locks every node of ``targets`` (``what`` names them)."""
        mine = set(self.targets)
        uncovered = tuple(target for target in targets if target not in mine)
        if uncovered:
            raise InvalidLockArgument(
                f"the ticket locks {names(self.targets)}: it does not cover {names(uncovered)} of {what}. A "
                "ticket hands over what its lock took, not ids its owner held already under another lock; hand "
                "off a lock that took every id, or lock the others where the ticket is claimed"
            )

    def encode(self) -> str:
        """Return the ticket as a compact signed string, safe in task arguments (JSON, pickle, URLs)."""
        data = {
            "h": self.holder_id,
            "o": self.owner_key,
            "n": [[node.namespace, node.kind.value, node.key, mode.value] for node, mode in self.targets],
            "k": self.token,
            "l": self.ttl,
            "i": self.intent,
            "c": self.checkpoint,
            "r": self.reentrant,
        }
        if self.held_apart:
            data["a"] = [[node.namespace, node.kind.value, node.key, mode.value] for node, mode in self.held_apart]
        return signing.dumps(data, salt=SALT, compress=True)

    @classmethod
    def decode(cls, text: str) -> Ticket:
        """Return the ticket ``text`` encodes; raise InvalidLockArgument if it is not one of ours."""
        if not isinstance(text, str):
            raise InvalidLockArgument(f"a lock ticket is a str, not {type(text).__name__}")
        try:
            data = signing.loads(text, salt=SALT)
            return cls(
                holder_id=data["h"],
                owner_key=data["o"],
                targets=_targets(data["n"]),
                token=data["k"],
                ttl=data["l"],
                intent=data["i"],
                checkpoint=data["c"],
                reentrant=data["r"],
                held_apart=_targets(data.get("a", ())),  # absent from tickets of earlier releases
            )
        except (signing.BadSignature, KeyError, TypeError, ValueError) as e:
            raise InvalidLockArgument(f"not a lock ticket, or not signed with this SECRET_KEY: {e}") from e

    def records(self) -> list[HolderRecord]:
        """The holder as ``take_over`` is given it: its nodes, id, handing owner and intent."""
        return [
            HolderRecord(
                node=node,
                mode=mode,
                holder_id=self.holder_id,
                owner={"key": self.owner_key},
                token=self.token,
                acquired_at=None,
                expires_at=_NEVER,  # not read: the store judges the lease
                intent=self.intent,
                checkpoint=self.checkpoint,
            )
            for node, mode in self.targets
        ]


def _targets(encoded: Any) -> Targets:
    return tuple((Node(ns, Kind(kind), key), Mode(mode)) for ns, kind, key, mode in encoded)


def names(targets: Targets) -> str:
    """The nodes of ``targets``, for a message."""
    return ", ".join(str(node) for node, _ in targets)
