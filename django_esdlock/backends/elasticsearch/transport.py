"""The Elasticsearch backend's way to the store: its clients, a store call as a step, ``_bulk``, busy and resends.

Every operation of the backend is written as steps (:mod:`django_esdlock.steps`)
whose store calls are :class:`StoreCall`; :meth:`Transport.perform` makes one
with the blocking client and :meth:`Transport.aperform` with the running
loop's async client, so one copy of each operation serves ``acquire`` and
``aacquire``. What to do when the store is busy, loses an answer or fails is
decided here, once, in steps (:meth:`Transport._call_steps`,
:meth:`Transport._bulk_steps`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import itertools
import logging
import math
import os
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ... import observability
from ...exceptions import LockBackendUnavailable, LockStoreBusy
from ...redaction import redact
from ...steps import Sleep, Steps
from ..base import backoff_delay, close_per_loop
from .answers import BUSY_STATUSES, busy, under_replicated

try:
    import elasticsearch
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImproperlyConfigured(
        "The Elasticsearch lock backend needs the 'elasticsearch' package: pip install 'django-esdlock[elasticsearch]'"
    ) from e

logger = logging.getLogger("django_esdlock")

BUSY_BACKOFF_CAP = 1.0
"""Longest sleep between two tries of a busy store, in seconds."""

LOST_ANSWER = (elasticsearch.ConnectionError, elasticsearch.ConnectionTimeout)
"""Failures after which the request may or may not have been applied: resent to another host."""

CLIENT_OPTIONS = frozenset(inspect.signature(elasticsearch.Elasticsearch.__init__).parameters) - {"self", "hosts"}
"""The keywords of ``elasticsearch.Elasticsearch`` that OPTIONS may pass through to the client."""

INCARNATION_TRIES = 8
"""Rounds of looking at a lock index and creating or replacing its concrete index before giving up."""


@dataclasses.dataclass(frozen=True)
class StoreCall:
    """A client call to make: ``client.<name>(**kwargs)``, the name dotted for namespaces (``indices.create``)."""

    name: str
    kwargs: dict[str, Any]
    options: dict[str, Any] | None = None
    """For ``client.options(...)`` first (``ignore_status``, ``request_timeout``)."""


OPTION_CLIENTS_KEPT = 32
"""Clients with per-call options (:func:`with_options`) kept per client, at most."""

_option_clients: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()


def with_options(client: Any, options: dict[str, Any]) -> Any:
    """Return ``client.options(**options)``, made once per set of options and kept.

    ``options()`` builds a whole client: every namespace, each reading the
    environment for OpenTelemetry. Measured on an uncontended tree lock pair
    (two requests, each with its own ``request_timeout``): 0.2-0.4 ms of CPU
    per request, a quarter of what the pair costs the process. The timeouts
    :func:`bounded` gives are rounded, so a process sees few sets. A kept
    client shares the transport (connections, node pool) with ``client``.
    """
    key = tuple(sorted(options.items()))
    kept = _option_clients.setdefault(client, {})
    found = kept.get(key)
    if found is None:
        found = client.options(**options)
        if len(kept) >= OPTION_CLIENTS_KEPT:
            kept.clear()  # seldom: start over (single dict operations: no lock a fork could inherit held)
        kept[key] = found
    return found


def perform_on(client: Any, call: StoreCall) -> Any:
    """Make ``call`` with ``client`` (blocking or async: the async one returns an awaitable)."""
    if call.options:
        client = with_options(client, call.options)
    for name in call.name.split("."):
        client = getattr(client, name)
    return client(**call.kwargs)


def rounded_down(seconds: float) -> float:
    """Return ``seconds`` rounded down to two significant digits (5.9973 -> 5.9; 0.0456 -> 0.045)."""
    if seconds <= 0:
        return seconds
    step = 10.0 ** (math.floor(math.log10(seconds)) - 1)
    return max(step, math.floor(seconds / step) * step)


def bounded(call: StoreCall, action: str, deadline: float | None, share: float = 1.0) -> StoreCall:
    """Return ``call`` with the client's ``request_timeout`` set to ``share`` of what is left before ``deadline``.

    Rounded down to two significant digits (at most 10 % less): a few distinct
    timeouts, whose clients :func:`with_options` keeps.
    """
    if deadline is None:
        return call
    left = deadline - time.monotonic()
    if left <= 0:
        raise LockBackendUnavailable(f"Elasticsearch had no time left to {action}: the lease it serves runs out")
    return dataclasses.replace(call, options={**(call.options or {}), "request_timeout": rounded_down(left * share)})


def body_of(response: Any) -> dict[str, Any]:
    """Return a client response as a plain dict."""
    return dict(getattr(response, "body", response) or {})


def error_type(error: LockBackendUnavailable) -> str | None:
    """Return the Elasticsearch error type behind ``error`` (``index_not_found_exception``, ...), if any."""
    cause = error.__cause__
    return getattr(cause, "error", None) if isinstance(cause, elasticsearch.ApiError) else None


def item_lines(operations: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split ``_bulk`` lines into one list per item: an action line, and its body unless it deletes."""
    items: list[list[dict[str, Any]]] = []
    lines = iter(operations)
    for action in lines:
        items.append([action] if "delete" in action else [action, next(lines)])
    return items


class Transport:
    """The clients of an :class:`~django_esdlock.backends.elasticsearch.ElasticsearchLockBackend` and its store calls.

    A mixin of the backend: it reads the backend's ``hosts``,
    ``client_options``, ``busy_retry`` and ``write_timeout``, and, in
    :meth:`_bulk_steps`, asks :class:`~.index.IndexSetup` which incarnation
    of a lock index an item landed in.
    """

    def _init_transport(self) -> None:
        self._client: elasticsearch.Elasticsearch | None = None
        self._client_pid: int | None = None
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, elasticsearch.AsyncElasticsearch] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def client(self) -> elasticsearch.Elasticsearch:
        """The client of this process: a forked child opens its own connections."""
        if self._client is None or self._client_pid != os.getpid():
            self._client = elasticsearch.Elasticsearch(self.hosts, **self._transport_options())
            self._client_pid = os.getpid()
        return self._client

    @property
    def aclient(self) -> elasticsearch.AsyncElasticsearch:
        """The async client of the running event loop (one per loop: its connections belong to it)."""
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:
            client = self._aclients[loop] = elasticsearch.AsyncElasticsearch(self.hosts, **self._transport_options())
        return client

    @property
    def resends(self) -> int:
        """How many times a request that met a connection failure or timeout is sent again (OPTIONS
        ``max_retries``; default one more try per host, at least 3)."""
        return int(self.client_options.get("max_retries", max(3, len(self.hosts))))

    def _transport_options(self) -> dict[str, Any]:
        """The client's options: OPTIONS over our defaults for a cluster.

        The transport's node pool marks a host that failed to connect or
        timed out dead for a while and sends the next request to another: so
        a dying node costs a resend, not an error. We resend ourselves
        (:meth:`_call_steps`), not the transport (``max_retries=0`` here),
        because a resent release must know it was resent: its first send may
        have done the work. Every lock write may be sent twice safely (a
        holder is keyed by its id; release and renewal are idempotent). A
        busy node's answer is not resent at once (``retry_on_status=()``):
        we back off instead. Sniffing stays off: it would replace the hosts
        you gave with the addresses the nodes publish.
        """
        defaults = {"retry_on_status": (), "retry_on_timeout": True}
        return {**defaults, **self.client_options, "max_retries": 0}

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._client_pid == os.getpid():
            client.close()
        aclients, self._aclients = self._aclients, weakref.WeakKeyDictionary()
        close_per_loop(aclients, lambda aclient: aclient.close())

    async def aclose(self) -> None:
        """Close the async client of the running loop (the blocking one stays)."""
        client = self._aclients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def perform(self, call: StoreCall) -> Any:
        """Make ``call`` with the blocking client: the ``perform`` of :func:`.steps.drive`."""
        return perform_on(self.client, call)

    async def aperform(self, call: StoreCall) -> Any:
        """Make ``call`` with the running loop's async client: the ``perform`` of :func:`.steps.adrive`."""
        return await perform_on(self.aclient, call)

    @contextlib.contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """Turn client and transport failures into LockBackendUnavailable (LockStoreBusy for "not now")."""
        try:
            yield
        except (elasticsearch.ApiError, elasticsearch.TransportError) as e:
            is_busy = isinstance(e, elasticsearch.ApiError) and e.meta.status in BUSY_STATUSES
            error = LockStoreBusy if is_busy else LockBackendUnavailable
            raise error(f"Elasticsearch failed to {action} ({self.describe()}): {redact(e)}") from e

    def _call_steps(
        self,
        action: str,
        call: StoreCall,
        *,
        retry_for: float | None = None,
        resent: list[bool] | None = None,
        deadline: float | None = None,
    ) -> Steps[Any]:
        """Make ``call``; while the store is busy, retry with backoff for ``retry_for`` seconds.

        The default is :attr:`busy_retry`; 0 tries once. A connection failure
        or timeout is sent again at once, to the next host, :attr:`resends`
        times (appending to ``resent`` each time). Other failures are not
        retried. With ``deadline`` (``time.monotonic()``), every send is given
        the client's ``request_timeout`` of what is left before it, and none
        is made after it; with another host to resend to, the first send
        gets half of it, so a node that hangs (killed, cut off) leaves the
        next host time to answer within the bound.
        """
        busy_until = time.monotonic() + (self.busy_retry if retry_for is None else retry_for)
        resends = 0
        for attempt in itertools.count():
            share = 0.5 if len(self.hosts) > 1 and resends == 0 else 1.0
            try:
                sent = bounded(call, action, deadline, share)  # no time left: no round trip, none counted
                with observability.store_request(self, action), self._translate(action):
                    return (yield sent)
            except LockStoreBusy:
                delay = backoff_delay(attempt, cap=BUSY_BACKOFF_CAP)
                if time.monotonic() + delay > min(busy_until, math.inf if deadline is None else deadline):
                    raise
                yield Sleep(delay)
            except LockBackendUnavailable as e:
                if not isinstance(e.__cause__, LOST_ANSWER) or resends >= self.resends:
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                resends += 1
                if resent is not None:
                    resent.append(True)
                logger.info("resending to another node after %s", e.__cause__)
        raise AssertionError("unreachable")  # pragma: no cover

    def _bulk_steps(
        self,
        operations: list[dict[str, Any]],
        action: str,
        *,
        retry_for: float | None = None,
        resent: list[bool] | None = None,
        deadline: float | None = None,
    ) -> Steps[list[dict[str, Any]]]:
        """Send ``operations`` in one ``_bulk``; return its items in order.

        While the store is busy, as a whole or for some items, send again what
        it turned away, with backoff, for ``retry_for`` seconds (see
        :meth:`_call_steps`); items still busy then come back as they were
        answered. ``deadline`` bounds every send (see :meth:`_call_steps`).
        Items that did not land in their lock index's incarnation (it was
        deleted or replaced) are sent again once the lock index is settled
        (:meth:`~.index.IndexSetup._lock_index_steps`): no answer from elsewhere is returned.
        """
        if not operations:
            return []  # a bulk without a body is a 400
        # Every write knows the lock index's incarnation and whether the cluster takes require_alias.
        yield from self._ensure_index_steps()
        lines = item_lines(operations)
        items: list[dict[str, Any]] = [{}] * len(lines)
        pending = list(range(len(lines)))
        busy_until = time.monotonic() + (self.busy_retry if retry_for is None else retry_for)
        if self._active_shards is None:
            self._active_shards = yield from self._active_shards_steps()
        repairs = 0
        for attempt in itertools.count():
            write_timeout = self.write_timeout
            if deadline is not None:  # the shard copies' wait must end before the request's
                write_timeout = max(0.001, min(write_timeout, deadline - time.monotonic()))
            durability = {"wait_for_active_shards": self._active_shards, "timeout": f"{round(write_timeout * 1000)}ms"}
            batch = [line for i in pending for line in self._aliased(lines[i])]
            with self._sole_lock:
                sent = {a: (c, self._current_high.get(a, 0)) for a, c in self._current.items()}
            answer = yield from self._call_steps(
                action,
                StoreCall("bulk", {"operations": batch, **durability}),
                retry_for=max(0.0, busy_until - time.monotonic()),
                resent=resent,
                deadline=deadline,
            )
            answered = answer["items"]
            for i, item in zip(pending, answered, strict=True):
                items[i] = under_replicated(item, self._required_copies)
            misplaced = [i for i in pending if self._misplaced(lines[i][0], items[i], sent)]
            pending = [i for i in pending if busy(items[i]) or i in misplaced]
            if misplaced:
                # The lock index is gone or was replaced: settle it, then send those items again.
                if repairs >= INCARNATION_TRIES:
                    where = {next(iter(lines[i][0].values()))["_index"] for i in misplaced}
                    raise LockBackendUnavailable(
                        f"Elasticsearch failed to {action}: lock index {', '.join(sorted(where))} keeps "
                        f"disappearing ({self.describe()})"
                    )
                repairs += 1
                for alias in sorted({next(iter(lines[i][0].values()))["_index"] for i in misplaced}):
                    yield from self._lock_index_steps(alias)
                continue
            delay = backoff_delay(attempt, cap=BUSY_BACKOFF_CAP)
            if not pending or time.monotonic() + delay > min(busy_until, math.inf if deadline is None else deadline):
                return items
            yield Sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover
