"""The interface every lock store implements, around one primitive."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import functools
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from django.core import checks

from ..exceptions import LockStoreBusy
from ..limits import Limits
from ..modes import Mode
from ..records import Grant, HolderPage, HolderRecord, LockRequest, Node, Owner, WaitState, main_record

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class StoreFeatures:
    """What a store can do beyond the primitive: what the rest of the package asks before it uses a method.

    A backend declares them (:attr:`BaseLockBackend.features`); a feature it
    declares False is never called for, and the admin, ``reap_locks``, deadlock
    detection, hand-off, ``lock_check`` and ``lock_bench`` say so instead.
    """

    can_list_waiting: bool = False
    """:meth:`~BaseLockBackend.wait_state`: deadlock detection, the admin's waiting page, ``reap_locks``' graph."""
    can_take_over: bool = False
    """:meth:`~BaseLockBackend.take_over`, :meth:`~BaseLockBackend.holder_records` and
    :meth:`~BaseLockBackend.expired_with_intent`: hand-off, recovery of intents, the reaper's takeover."""
    notifies: bool = False
    """:meth:`~BaseLockBackend.wait_release` wakes on a release instead of sleeping a backoff step."""
    async_native: bool = False
    """The ``a*`` methods run on the event loop; otherwise each call runs its sync twin in a worker thread."""
    fails_over: bool = False
    """The store is a cluster of nodes that can fail over (``lock_check``'s failover fault applies)."""


class BaseLockBackend(abc.ABC):
    """A lock store: takes, renews, releases and lists holders of nodes.

    Constructors do no I/O; connections open on first use. All times that
    decide expiry are read from the store's clock, never from this host's.

    A new store implements the abstract methods (the primitive: :meth:`acquire`,
    :meth:`release`, :meth:`renew`; and :meth:`holders`, :meth:`node_holders`,
    :meth:`evict_expired`), declares :attr:`url_schemes` with
    :meth:`options_from_url` and :attr:`features`, and implements what each
    feature it declares names.
    """

    url_schemes: ClassVar[frozenset[str]] = frozenset()
    """The ``LOCK_BACKEND`` URL schemes this store answers to (``conf.BACKENDS`` lists the stores asked)."""

    @classmethod
    def options_from_url(cls, url: str) -> dict[str, Any]:
        """Return the OPTIONS a ``LOCK_BACKEND`` URL of one of :attr:`url_schemes` means.

        ``url`` comes without the query parameters that are the lock
        settings' own (``ttl``, ``deadlock_timeout``, ``max_...``); other
        query parameters are the store's.
        """
        raise NotImplementedError(f"{cls.__name__} declares no URL scheme")

    features: StoreFeatures = StoreFeatures()
    """What this store can do beyond the primitive (see :class:`StoreFeatures`)."""

    def endpoints(self) -> tuple[list[tuple[str, int]], str]:
        """Return the (host, port) of each TCP endpoint of the store, or ``[]`` and why there is none to cut.

        ``lock_check``'s store fault puts a proxy in front of each.
        """
        return [], f"{type(self).__name__} names no TCP endpoint"

    def options_through(self, options: dict[str, Any], ports: Sequence[int]) -> dict[str, Any]:
        """Return ``options`` reaching the store through proxies on 127.0.0.1, one port per :meth:`endpoints` entry."""
        raise NotImplementedError(f"{type(self).__name__} names no TCP endpoint")

    @property
    def supports_notify(self) -> bool:
        """Whether :meth:`wait_release` wakes on a release (``features.notifies``)."""
        return self.features.notifies

    page_size: int = 500
    """How many nodes maintenance work (reaping, searches) reads and writes at a time."""

    queued_poll_cap: float = 0.01
    """Longest sleep between attempts of a queued request: the lock idles while the head of its queue sleeps.

    Stores that wake waiters on release poll less often.
    """

    def queued_poll_interval(self, request: LockRequest) -> float:
        """Return the longest pause between two attempts of the refused, queued ``request``."""
        return self.queued_poll_cap

    marker_ttl: float = 3.0
    """Seconds a waiting marker lasts unless its request tries again (it must outlast a backoff step)."""

    deadlock_timeout: float | None = 1.0
    """Seconds a request waits before it looks for a deadlock, and between two looks (None: never looks).

    Like PostgreSQL's ``deadlock_timeout``: detection reads the store, so it
    runs only for requests that have waited this long. Set by
    ``LOCK_BACKEND["DEADLOCK_TIMEOUT"]``.
    """

    limits: Limits = Limits()
    """What one request may carry (intent, checkpoint, ids): set from ``LOCK_BACKEND["MAX_..."]``."""
    lease_margin: float = 0.1
    """Seconds by which a holder's view of its lease ends before the earliest moment the store could judge it over.

    The holder counts a lease from the moment it sent the request that set
    it, which is never later than the store's own stamp; the margin covers
    what still could make the store's clock run ahead of that count: its
    granularity, and the holder's own delay in noticing. Backends whose
    clock may stamp a lease in the past (Elasticsearch's cached ``ctx._now``)
    need more. See :meth:`held_for`.
    """

    clock_skew_margin: float = 0.0
    """Seconds the store's nodes' clocks may differ by, which the holder also takes off its view of the lease.

    A lease is stamped by one node's clock and may be judged by another's (a
    new primary after a failover): a node whose clock runs ahead ends it
    early. ``LOCK_BACKEND["CLOCK_SKEW_MARGIN"]`` sets it; the default is the
    store's (0 for a database, whose one server stamps and judges; 0.5 s on
    Elasticsearch). ``check --deploy`` warns where the measured skew exceeds
    it (Elasticsearch: ``django_esdlock.W011``).
    """

    lock_delay: float = 0.0
    """Seconds a node stays refused to conflicting requests after a holder's lease ran out there (Chubby's lock-delay).

    A holder that released is gone at once; one whose lease ended (its
    process paused, partitioned or dead) or that an operator evicted still
    blocks, by the store's clock, until ``lock_delay`` after that end: its
    unfenced writes, late by less than that, land before anyone else's.
    Judged by each request with its own backend's value, so every process
    sharing a store sets the same ``LOCK_BACKEND["LOCK_DELAY"]`` (default 0).
    """

    @property
    def lock_delay_ms(self) -> int:
        return round(self.lock_delay * 1000)

    def held_for(self, ttl: float) -> float:
        """Return how long after sending a grant's or renewal's request its holder may count on a ``ttl`` lease.

        ``ttl`` less :attr:`lease_margin` and :attr:`clock_skew_margin`, but
        never less than three quarters of it: a TTL under four margins gets a
        smaller margin than the store needs (documented; give such stores
        longer TTLs).
        """
        return ttl - min(self.lease_margin + self.clock_skew_margin, ttl / 4)

    @property
    def marker_ttl_ms(self) -> int:
        return round(self.marker_ttl * 1000)

    def __init__(self, *, ttl: float = 30.0) -> None:
        self.ttl = ttl

    # --- the primitive -------------------------------------------------

    @abc.abstractmethod
    def acquire(self, request: LockRequest) -> Grant | None:
        """Take every (node, mode) of the request for its holder, all or nothing.

        Return the grant, or None if a live holder of any node conflicts, or
        a waiting marker queued before it (see ``LockRequest.ticket``). On
        None nothing of the request is left held; a request with a ticket
        leaves its waiting markers. Evict expired
        holders (that carry no intent) met on the way. Raise
        LockBackendUnavailable if the store fails; leave nothing held then
        either, or only what the lease will expire.
        """

    @abc.abstractmethod
    def release(self, grant: Grant) -> bool:
        """Remove this grant's holders; delete nodes left with none.

        Return False if some holder was already gone (the lock had been lost).
        """

    @abc.abstractmethod
    def renew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> bool:
        """Extend the lease of this grant's holders by the request's TTL.

        Record ``checkpoint`` and ``recovery`` with the holders when given.
        Return False if any holder is gone, already expired, or now belongs to
        another owner (a reaper took it over): the lock is lost. With
        ``timeout``, give up (LockBackendUnavailable) after about that many
        seconds: the caller's lease is running out.
        """

    def renew_many(self, grants: Sequence[Grant], *, timeout: float | None = None) -> list[bool | None]:
        """Extend the leases of ``grants`` together, in as few store calls as the store allows.

        Return, per grant, True (renewed), False (lost, as :meth:`renew`
        says) or None (not done this time: the store was busy for it, try
        again). Raise LockBackendUnavailable if the store failed as a whole.
        ``timeout`` bounds the whole as it does :meth:`renew`. The default
        renews one grant after another.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        outcomes: list[bool | None] = []
        for grant in grants:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                outcomes.append(None)
                continue
            try:
                outcomes.append(self.renew(grant, timeout=left))
            except LockStoreBusy:
                outcomes.append(None)
        return outcomes

    # --- inspection and maintenance -------------------------------------

    @abc.abstractmethod
    def holders(
        self,
        *,
        namespace: str | None = None,
        path_prefix: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        mode: Mode | None = None,
        host: str | None = None,
        expired: bool | None = None,
        parent: str | None = None,
    ) -> HolderPage:
        """Return one page of holders in a stable order, without loading the rest.

        A page holds the matching holders of at most ``limit`` nodes, ordered
        by namespace, kind and key. ``path_prefix`` matches the start of the
        key; ``parent`` the tree nodes directly below a path ("" for the top
        level); ``mode``, ``host`` (the owner's) and ``expired`` (by the
        store's clock) select holders within nodes.
        """

    @abc.abstractmethod
    def node_holders(self, node: Node) -> list[HolderRecord]:
        """Return the holders recorded on one node, expired ones included."""

    @abc.abstractmethod
    def evict_expired(
        self,
        *,
        namespace: str | None = None,
        grace: float = 0.0,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> list[HolderRecord]:
        """Remove holders expired for more than ``grace`` seconds by the store's clock.

        Holders that carry an intent are left for recovery. Delete nodes left
        empty. Work page by page (:attr:`page_size` nodes), calling
        ``progress`` with the running count after each. Return what was (or,
        with ``dry_run``, would be) removed.
        """

    def refusal_reason(self, request: LockRequest) -> str | None:
        """Return why the store refused ``request`` last when no conflict did ("was refused by ..."), else None."""
        return None

    def withdraw(self, request: LockRequest) -> None:
        """Remove the waiting markers ``request`` left (it gave up); markers also expire by themselves."""

    def wait_state(self, nodes: Sequence[Node] | None = None) -> WaitState:
        """Return the live waiting markers and the holders that block on their nodes, by the store's clock.

        With ``nodes``, read those nodes alone, as they are now (no index
        lag): a second read that confirms a cycle. Without, every live marker
        in the store.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot list waiting requests")

    def holder_records(self, holder_id: str) -> list[HolderRecord]:
        """Return the records of one holder on every node it holds."""
        raise NotImplementedError(f"{type(self).__name__} cannot look a holder up by id")

    def force_release(self, holder_id: str, nodes: Sequence[Node]) -> bool:
        """Remove holder ``holder_id`` from ``nodes`` whoever owns it now; True if it was on all.

        Unconditional: a holder renewed or claimed since it was read goes too.
        The reaper and the admin use ``django_esdlock.reaper.release_if_unchanged()``.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot force a release")

    def expired_with_intent(self, *, namespace: str | None = None, grace: float = 0.0) -> list[HolderRecord]:
        """Return the records (every node) of holders that expired carrying an intent."""
        raise NotImplementedError(f"{type(self).__name__} cannot list holders awaiting recovery")

    def take_over(
        self,
        records: Sequence[HolderRecord],
        owner: Owner,
        *,
        ttl: float,
        recovery: dict[str, Any] | None,
        require_expired: bool = True,
        require_live: bool = False,
        require_unchanged: bool = False,
    ) -> Grant | None:
        """Hand one holder's records to ``owner`` with a fresh lease and a new fencing token.

        Take the arbiter record (the holder's S or X node) first, and only if
        it still has the owner it was read with and, with ``require_expired``,
        its lease ran out (a reaper's takeover) or, with ``require_live``, its
        lease still runs (a hand-off's claim), and, with ``require_unchanged``,
        it still has the lease it was read with (``expires_at``, to the
        millisecond: a renewal since then keeps it): of several callers
        exactly one wins. Keep intent and checkpoint; record ``recovery``
        (None: none). Return the grant, or None.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot take a holder over")

    def wait_release(self, request: LockRequest, timeout: float, attempt: int) -> None:
        """Block until a release may have freed a node the refused ``request`` asks for, at most ``timeout`` seconds.

        The default sleeps a capped exponential backoff step with jitter;
        stores that can notify override it.
        """
        time.sleep(min(timeout, backoff_delay(attempt, cap=max(timeout, BACKOFF_CAP))))

    # --- the async twins ---------------------------------------------------
    #
    # By default each runs its sync method in a worker thread for the length of
    # one call (a try, a release), never for a whole wait: a waiting task sleeps
    # on the event loop. Backends with an async driver override them.

    async def aacquire(self, request: LockRequest) -> Grant | None:
        """Async :meth:`acquire`."""
        return await asyncio.to_thread(self.acquire, request)

    async def arelease(self, grant: Grant) -> bool:
        """Async :meth:`release`."""
        return await asyncio.to_thread(self.release, grant)

    async def arenew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> bool:
        """Async :meth:`renew`."""
        call = functools.partial(self.renew, grant, checkpoint=checkpoint, recovery=recovery, timeout=timeout)
        return await asyncio.to_thread(call)

    async def atake_over(
        self,
        records: Sequence[HolderRecord],
        owner: Owner,
        *,
        ttl: float,
        recovery: dict[str, Any] | None,
        require_expired: bool = True,
        require_live: bool = False,
        require_unchanged: bool = False,
    ) -> Grant | None:
        """Async :meth:`take_over`."""
        call = functools.partial(
            self.take_over,
            records,
            owner,
            ttl=ttl,
            recovery=recovery,
            require_expired=require_expired,
            require_live=require_live,
            require_unchanged=require_unchanged,
        )
        return await asyncio.to_thread(call)

    async def await_state(self, nodes: Sequence[Node] | None = None) -> WaitState:
        """Async :meth:`wait_state`."""
        return await asyncio.to_thread(self.wait_state, nodes)

    async def awithdraw(self, request: LockRequest) -> None:
        """Async :meth:`withdraw`."""
        await asyncio.to_thread(self.withdraw, request)

    async def aclose(self) -> None:
        """Close what the running event loop's calls opened (call it before the loop ends)."""

    async def await_release(self, request: LockRequest, timeout: float, attempt: int) -> None:
        """Async :meth:`wait_release`: by default a backoff step on the event loop."""
        await asyncio.sleep(min(timeout, backoff_delay(attempt, cap=max(timeout, BACKOFF_CAP))))

    def setup(self) -> None:
        """Create what the store needs (index, tables); safe to call again."""

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Return system check messages about this store (reachable, well formed); this contacts the store.

        Only ``manage.py check --deploy`` runs it: ``migrate`` and every other
        command must work while the store is down.
        """
        return []

    def close(self) -> None:
        """Close connections; the backend reopens them on next use."""

    def describe(self) -> str:
        """Return a short human description of the store, for the admin and logs."""
        return type(self).__name__


def takeover_request(
    records: Sequence[HolderRecord],
    owner: Owner,
    ttl: float,
    *,
    require_expired: bool = False,
    require_live: bool = False,
) -> tuple[list[HolderRecord], HolderRecord, LockRequest]:
    """Return a holder's records in node order, its arbiter record and the request that takes it over."""
    records = sorted(records, key=lambda r: r.node.id)
    holder_ids = {r.holder_id for r in records}
    if require_expired and require_live:
        raise ValueError("take_over cannot require a lease both expired and live")
    if len(holder_ids) != 1:
        raise ValueError(f"take_over needs the records of exactly one holder, got {sorted(holder_ids)}")
    arbiter = main_record(records)
    request = LockRequest(
        holder_id=arbiter.holder_id,
        owner=owner,
        targets=tuple((r.node, r.mode) for r in records),
        ttl=ttl,
        intent=arbiter.intent,
    )
    return records, arbiter, request


def expires_ms(record: HolderRecord) -> int:
    """The lease of ``record`` in milliseconds since the epoch, as the stores keep it (``require_unchanged``)."""
    return round(record.expires_at.timestamp() * 1000)


def renew_params(grant: Grant, checkpoint: Any, recovery: Any) -> dict[str, Any]:
    """Return what a store's renewal of ``grant`` is given: whose lease, for how long, its token and progress."""
    return {
        "holder_id": grant.request.holder_id,
        "owner_key": grant.request.owner.key,
        "ttl_ms": grant.request.ttl_ms,
        "token": grant.token,
        "checkpoint": checkpoint,
        "recovery": recovery,
    }


BACKOFF_INITIAL = 0.005
BACKOFF_CAP = 0.5


def backoff_delay(attempt: int, *, initial: float = BACKOFF_INITIAL, cap: float = BACKOFF_CAP) -> float:
    """Return the sleep before retry ``attempt`` (0-based): capped exponential, equal jitter."""
    ceiling = min(cap, initial * (2 ** min(attempt, 30)))
    return random.uniform(ceiling / 2, ceiling)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def close_per_loop(per_loop: Mapping[asyncio.AbstractEventLoop, T], close: Callable[[T], Awaitable[Any]]) -> None:
    """Close what each event loop opened, on that loop: from a blocking ``close()``.

    A loop that is gone took its connections with it; one that runs in
    another thread closes them there (waiting a few seconds); the loop of
    this very thread cannot be waited for here (that is ``aclose()``'s job).
    """
    for loop, resource in list(per_loop.items()):
        if loop.is_closed() or loop is running_loop():
            continue
        if loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(resource), loop).result(timeout=5)  # type: ignore[arg-type]
        else:
            loop.run_until_complete(close(resource))
