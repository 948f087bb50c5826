"""Hand a held lock to another process: ``ticket = lock.handoff()`` there, ``with resume_lock(ticket):`` here.

A view takes the lock at once (the user sees it locked), hands it off and
enqueues a task with the ticket; the worker claims it. The claim is one
conditional takeover in the store (``take_over(..., require_live=True)``):
it succeeds only while the lease the hand-off set still runs and the holder
still has the owner that handed it off, so of two claims (a task delivered
twice) exactly one wins, and a claim after the lease ran out fails with
LockLost. The claimant becomes the holder under a new fencing token, larger
than the handing process's, with the same holder id, intent and checkpoint;
the handing process's late writes are fenced off.

Nobody renews the lease between the hand-off and the claim: a ticket stays
valid for ``handoff(ttl=...)`` seconds by the store's clock. An unclaimed
ticket is an expired holder like any other: without an intent the next
acquisition (or ``reap_locks``) evicts it, with one the reaper recovers it.

A ticket hands over what its lock took, never what its owner held already:
a ``lock_documents`` of ids the owner holds under another lock counts them
as taken without writing them, and that other lock is not handed off. A
claim must not then write ids nobody holds: ``resume_lock`` refuses a ticket
that does not cover every id its lock was asked for, and ``@locked(ticket=)``
one that does not lock exactly what the task's arguments name, both with
InvalidLockArgument before any request is sent (so before the task's body
runs; the ticket is left to its lease). Refused rather than completed by
taking the missing ids in the worker: the view usually still holds them
when the task starts (it enqueues inside its block), so that would fail by
timing, and a hand-off that does not cover its task is a bug of the view.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .aio import AsyncLock, shielded
from .backends.base import BaseLockBackend
from .exceptions import LockLost
from .locks import Lock
from .records import Grant, Owner
from .tickets import Ticket

__all__ = ["AsyncResumedLock", "ResumedLock", "Ticket", "aresume_lock", "resume_lock"]

logger = logging.getLogger(__name__)


class _Resumed:
    """What ResumedLock and AsyncResumedLock share: acquiring is claiming the ticket."""

    ticket: Ticket

    def __init__(self, ticket: Ticket, *, ttl: float | None = None, backend: BaseLockBackend | None = None) -> None:
        super().__init__(  # type: ignore[call-arg]  # the Lock or AsyncLock after this mixin
            ticket.targets,
            timeout=0,
            ttl=ticket.ttl if ttl is None else ttl,
            intent=ticket.intent,
            reentrant=ticket.reentrant,
            backend=backend,
        )
        self.ticket = ticket
        self._checkpoint = dict(ticket.checkpoint) if ticket.checkpoint is not None else None

    def _recreate_cm(self) -> Any:
        return type(self)(self.ticket, ttl=self.ttl, backend=self._backend)  # type: ignore[attr-defined]

    def _claim_args(self) -> dict[str, Any]:
        if self._grant is not None:  # type: ignore[attr-defined]
            raise RuntimeError(f"{self!r} is already acquired; create a new lock object")
        return {
            "records": self.ticket.records(),
            "owner": Owner.current(),
            "ttl": self.ttl,  # type: ignore[attr-defined]
            "recovery": None,
            "require_expired": False,
            "require_live": True,
        }

    @staticmethod
    def _given_back_on_failure(grant: Grant) -> bool:
        """Whether a claimed grant that cannot reach the task is released: not with an intent, which the
        handing process may have half carried out; its lease ends it and the reaper recovers it."""
        if grant.request.intent is None:
            return True
        logger.warning("left the claimed holder %s to its lease and the reaper", grant.request.holder_id)
        return False

    def _claimed(self, grant: Grant | None) -> Grant:
        """Check a claim's outcome: the grant of every node of the ticket, else LockLost."""
        holder = f"holder {self.ticket.holder_id} of {self.ticket.targets[-1][0]}"
        if grant is None:
            raise LockLost(
                f"the ticket of {holder} could not be claimed: its lease ran out before the claim "
                "(see handoff(ttl=...)), or another claim won"
            )
        missing = {node for node, _ in self.ticket.targets} - set(grant.taken)
        if missing:
            # Part of the holder was evicted meanwhile: it protects nothing now. What was
            # claimed is left to its lease (an intent on it goes to the reaper), not released.
            raise LockLost(f"the ticket of {holder} was claimed without {sorted(map(str, missing))}")
        return grant


class ResumedLock(_Resumed, Lock):
    """The lock a ticket hands over: acquiring it claims the ticket, never waits; the rest is a Lock's."""

    def acquire(self) -> ResumedLock:
        """Become the holder the ticket names; raise LockLost if it cannot be claimed."""
        args = self._claim_args()
        backend = self.backend
        started = time.monotonic()
        grant = self._claimed(backend.take_over(**args))
        try:
            self._hold(grant, started)
        except BaseException:
            if self._given_back_on_failure(grant):
                self._give_back(backend, grant)
            raise
        logger.debug("resumed %r from a ticket of token %s", self, self.ticket.token)
        return self


class AsyncResumedLock(_Resumed, AsyncLock):
    """Async :class:`ResumedLock`: ``async with aresume_lock(ticket)``."""

    async def acquire(self) -> AsyncResumedLock:
        """Become the holder the ticket names; raise LockLost if it cannot be claimed."""
        args = self._claim_args()
        backend = self.backend
        started = time.monotonic()
        # Shielded: a claim cancelled halfway would leave a holder nobody renews or releases.
        grant = self._claimed(await shielded(backend.atake_over(**args)))
        try:
            self._hold(grant, started)
        except BaseException:
            if self._given_back_on_failure(grant):
                await self._give_back(backend, grant)
            raise
        return self


def resume_lock(ticket: str, *, ttl: float | None = None, backend: BaseLockBackend | None = None) -> ResumedLock:
    """Return the lock ``ticket`` hands over; entering it (or ``acquire()``) claims it.

    ``ttl`` is the lease the claimant renews (default: the handed-off lock's).
    The claim never waits: it raises LockLost if the ticket's lease ran out or
    another claim won. A ticket that does not cover every id its lock was
    asked for (see the module's docstring) raises InvalidLockArgument here.
    """
    return ResumedLock(_whole(Ticket.decode(ticket)), ttl=ttl, backend=backend)


def aresume_lock(ticket: str, *, ttl: float | None = None, backend: BaseLockBackend | None = None) -> AsyncResumedLock:
    """Async :func:`resume_lock`: ``async with aresume_lock(ticket) as lock``."""
    return AsyncResumedLock(_whole(Ticket.decode(ticket)), ttl=ttl, backend=backend)


def _whole(ticket: Ticket) -> Ticket:
    """Return ``ticket`` if it covers everything its lock was asked for; else raise InvalidLockArgument."""
    ticket.require_covers(ticket.targets + ticket.held_apart, "what its lock was asked for")
    return ticket
