"""The dialect interface of the database lock backend: one database's SQL, quirks and declared features.

After Django's ``db/backends/base/features.py``: what differs between
databases is a feature the dialect declares or a method it implements; the
shared backend (``backend.py``) asks those and never tests the vendor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from ...modes import Mode
from ...records import Grant, HolderRecord, LockRequest, Node
from ...steps import Steps, drive
from ..base import StoreFeatures
from .statements import on_cursor

Work = tuple[Any, bool]
"""What a unit of work on a cursor returns: its value, and whether to commit (inside a transaction)."""


class Dialect:
    """One database's SQL and quirks; the shared backend calls these and never tests the vendor.

    Methods named after a backend operation drive its ``*_steps`` on a
    cursor of the lock connection and return ``(value, commit)`` (see
    :data:`Work`): inside a transaction when :attr:`atomic_calls` is false,
    in autocommit otherwise.
    """

    vendor: ClassVar[str]
    """The ``vendor`` of the Django database wrappers this dialect serves (``backend.DIALECTS``)."""
    display_name: ClassVar[str]
    url_schemes: ClassVar[frozenset[str]] = frozenset()
    """The ``LOCK_BACKEND`` URL schemes of this database (as django-environ reads them)."""

    lock_delay_ms: int = 0
    """The backend's :attr:`~django_esdlock.backends.base.BaseLockBackend.lock_delay`, which acquisitions and
    releases judge expired holders by (set through the backend)."""

    # --- declared features ---------------------------------------------------

    atomic_calls: ClassVar[bool] = False
    """Whether acquire, release, renew and takeover are one autocommit statement each (no BEGIN/COMMIT).

    Then a call whose answer is lost may have committed a grant: the backend gives it back.
    """

    supports_notify: ClassVar[bool] = False
    """Whether a release wakes the waiting sessions it may free (:meth:`listen`, :meth:`wait_for_release`).

    Only with a driver that can wait for a notification (:meth:`driver_notifies`).
    """

    async_native: ClassVar[bool] = False
    """Whether the async API runs on sessions of the event loop's own (:meth:`loop_sessions`, the ``*_steps``).

    Only where the dialect notifies; else each async call runs its blocking twin in a worker thread.
    """

    evicts_by_grant: ClassVar[bool] = False
    """Whether the reaper pages through grants (:meth:`find_evictable`) rather than through nodes."""

    needs_database_file: ClassVar[bool] = False
    """Whether the database must be a file: an in-memory one would be private to each connection."""

    setup_may_race: ClassVar[bool] = False
    """Whether creating the tables may fail because another process created them meanwhile (then look again)."""

    BEGIN: ClassVar[str]
    COMMIT: ClassVar[str] = "COMMIT"
    ROLLBACK: ClassVar[str] = "ROLLBACK"
    CHECK: ClassVar[str] = "SELECT 1"
    PAGE: ClassVar[str]
    RECORDS: ClassVar[str]
    AFTER: ClassVar[str]
    NODE_FILTERS: ClassVar[dict[str, str]]
    HOLDER_FILTERS: ClassVar[dict[str, str]]

    def driver_notifies(self) -> bool:
        """Return whether the installed driver can wait for a notification (with :attr:`supports_notify`)."""
        return False

    def store_features(self) -> StoreFeatures:
        """Return the backend's features, from this dialect's and its driver's."""
        notifies = self.supports_notify and self.driver_notifies()
        return StoreFeatures(
            can_list_waiting=True,
            can_take_over=True,
            notifies=notifies,
            async_native=notifies and self.async_native,
        )

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        """Return the driver's own error classes, for the few calls Django does not wrap."""
        raise NotImplementedError

    def describe(self, settings_dict: dict[str, Any]) -> str:
        """Return where the lock database is, for messages (no credentials)."""
        raise NotImplementedError

    def endpoints(self, settings_dict: dict[str, Any]) -> tuple[list[tuple[str, int]], str]:
        """The server's (host, port), for ``lock_check``'s proxy; or ``[]`` and why there is no connection to cut."""
        return [], f"{self.display_name} has no connection to cut"

    def url_through(self, settings_dict: dict[str, Any], host: str, ports: Sequence[int]) -> str:
        """A database URL of ``settings_dict``'s database reached at ``host``:``ports`` (one port per server of the
        settings, its credentials kept)."""
        raise NotImplementedError(f"{self.display_name} has no connection to cut")

    @contextlib.contextmanager
    def setup_guard(self, wrapper: Any, settings_dict: dict[str, Any]) -> Iterator[None]:
        """Let one process at a time create the tables on this database."""
        yield

    def connection_options(self, options: dict[str, Any], ttl: float) -> dict[str, Any]:
        """Return the OPTIONS of a lock connection, given those of the configured database and the TTL."""
        return options

    def call_timeout(self, wrapper: Any, cursor: Any, ms: int | None) -> None:
        """Bound the calls on this connection to ``ms`` milliseconds from now on (None: lift the bound)."""

    def prepare(self, wrapper: Any, cursor: Any) -> None:
        """Set up a new connection for lock work."""

    def with_clock_steps(self, params: dict[str, Any]) -> Steps[dict[str, Any]]:
        """Return ``params`` plus what the listing filters need of the database's clock."""
        yield from ()  # a database whose filters read its clock themselves: no statement
        return params

    def with_clock(self, cursor: Any, params: dict[str, Any]) -> dict[str, Any]:
        return drive(self.with_clock_steps(params), on_cursor(cursor))

    # --- waking waiters (where supports_notify) --------------------------------

    def listening(self, wrapper: Any) -> bool:
        """Return whether this lock session already listens for releases."""
        raise NotImplementedError(f"{type(self).__name__} does not notify")

    def listen(self, wrapper: Any, cursor: Any) -> None:
        """Make this lock session listen for the releases that may free its waiting requests."""
        raise NotImplementedError(f"{type(self).__name__} does not notify")

    def failover_risk(self, cursor: Any) -> str | None:
        """Return why a failover of this database to one of its standbys may lose acknowledged grants, or None.

        A database without standbys (or without replication: SQLite) has none.
        """
        return None

    def wait_for_release(self, wrapper: Any, timeout: float) -> bool:
        """Block until a release is announced to this session (True) or ``timeout`` passes (False)."""
        raise NotImplementedError(f"{type(self).__name__} does not notify")

    def loop_sessions(self, wrapper: Any, size: int) -> Any:
        """Return the running event loop's sessions (``wrapper``'s settings, up to ``size`` at a time).

        They ``run(steps)`` on a session and ``aclose()``, and wake waiting
        tasks (``attempt_begins``, ``done_waiting``, ``wait``).
        """
        raise NotImplementedError(f"{type(self).__name__} has no async API of its own")

    # --- operations ------------------------------------------------------------

    def is_missing_schema(self, error: BaseException) -> bool:
        raise NotImplementedError

    # Every operation is written once as steps (a generator of Statement
    # steps returning the answer), which the blocking method of the same name
    # drives on the cursor. The four both APIs send return the answer alone:
    # a loop session drives them in autocommit, the blocking method commits
    # unless atomic_calls. The others return a Work: whether to commit is
    # theirs to say. A dialect without an async API of its own may override a
    # blocking method to drive steps that say so too (SQLite's acquire).

    def acquire_steps(self, request: LockRequest, nodes: list[Node], marker_ttl_ms: int) -> Steps[Grant | None]:
        """Return the grant, or None if a node refuses (leaving waiting markers for a request with a ticket)."""
        raise NotImplementedError(f"{type(self).__name__} drives acquire from its blocking method alone")

    def release_steps(
        self, holder_id: str, owner_key: str | None, released: Sequence[tuple[Node, Mode | None]]
    ) -> Steps[bool]:
        """Remove ``holder_id`` (of ``owner_key``, or anyone's) from the nodes; return whether it was on all."""
        raise NotImplementedError

    def withdraw_steps(self, request: LockRequest) -> Steps[None]:
        """Remove the waiting markers of ``request``."""
        raise NotImplementedError

    def renew_steps(self, grant: Grant, checkpoint: str | None, recovery: str | None) -> Steps[bool]:
        """Extend the lease of ``grant`` if it is still this owner's and live; return whether it was."""
        raise NotImplementedError

    def acquire(self, cursor: Any, request: LockRequest, nodes: list[Node], marker_ttl_ms: int) -> Work:
        return drive(self.acquire_steps(request, nodes, marker_ttl_ms), on_cursor(cursor)), not self.atomic_calls

    def release(
        self, cursor: Any, holder_id: str, owner_key: str | None, released: Sequence[tuple[Node, Mode | None]]
    ) -> Work:
        return drive(self.release_steps(holder_id, owner_key, released), on_cursor(cursor)), not self.atomic_calls

    def withdraw(self, cursor: Any, request: LockRequest) -> Work:
        return drive(self.withdraw_steps(request), on_cursor(cursor)), not self.atomic_calls

    def renew(self, cursor: Any, grant: Grant, checkpoint: str | None, recovery: str | None) -> Work:
        return drive(self.renew_steps(grant, checkpoint, recovery), on_cursor(cursor)), not self.atomic_calls

    # Only the blocking API sends these (the async API in a worker thread): their steps return a Work.

    def renew_many_steps(self, grants: Sequence[Grant]) -> Steps[tuple[list[bool], bool]]:
        """Return ``([renewed, per grant], commit)``: one after another, in the one transaction of the call."""
        renewed: list[bool] = []
        for grant in grants:
            renewed.append((yield from self.renew_steps(grant, None, None)))
        return renewed, True

    def take_over_steps(
        self, ids: list[str], params: dict[str, Any]
    ) -> Steps[tuple[tuple[int, set[str]] | None, bool]]:
        """Return ``((token, taken node ids) or None, commit)``."""
        raise NotImplementedError

    def evict_steps(self, rows: list[Sequence[Any]], grace_ms: int) -> Steps[tuple[list[HolderRecord], bool]]:
        """Remove the evictable holders among the page ``rows``; return their records."""
        raise NotImplementedError

    def find_evictable_steps(
        self, namespace: str | None, grace_ms: int, after: str, limit: int
    ) -> Steps[tuple[tuple[list[Sequence[Any]], list[str]], bool]]:
        """Return the records of the next ``limit`` evictable grants after holder id ``after``, and their ids."""
        raise NotImplementedError

    def drop_expired_markers_steps(self) -> Steps[tuple[None, bool]]:
        raise NotImplementedError

    def wait_state_steps(self, ids: list[str] | None) -> Steps[tuple[tuple[list[Any], list[Any]], bool]]:
        """Return ``((live marker rows, blocking holder rows), commit)``: of nodes ``ids``, or of every marker.

        Marker rows are ``WAITER_COLUMNS``; holder rows ``RECORD_COLUMNS``, of
        the holders (live, or awaiting recovery) on the markers' nodes.
        """
        raise NotImplementedError

    def raise_token_floor_steps(self, floor: int) -> Steps[tuple[bool, bool]]:
        """Make the token counter give only tokens above ``floor`` (never lower it); return whether it moved."""
        raise NotImplementedError

    def drop_idle_nodes_steps(self, after: str, limit: int) -> Steps[tuple[tuple[int, str], bool]]:
        """Delete node rows that no grant holds, among the next ``limit`` after id ``after``.

        Return ``((rows looked at, last id), commit)``; stores that delete a
        node with its last holder have nothing to do.
        """
        yield from ()  # no statement, steps all the same
        return (0, after), False

    def renew_many(self, cursor: Any, grants: Sequence[Grant]) -> Work:
        return drive(self.renew_many_steps(grants), on_cursor(cursor))

    def take_over(self, cursor: Any, ids: list[str], params: dict[str, Any]) -> Work:
        return drive(self.take_over_steps(ids, params), on_cursor(cursor))

    def evict(self, cursor: Any, rows: list[Sequence[Any]], grace_ms: int) -> Work:
        return drive(self.evict_steps(rows, grace_ms), on_cursor(cursor))

    def find_evictable(self, cursor: Any, namespace: str | None, grace_ms: int, after: str, limit: int) -> Work:
        return drive(self.find_evictable_steps(namespace, grace_ms, after, limit), on_cursor(cursor))

    def drop_expired_markers(self, cursor: Any) -> Work:
        return drive(self.drop_expired_markers_steps(), on_cursor(cursor))

    def wait_state(self, cursor: Any, ids: list[str] | None) -> Work:
        return drive(self.wait_state_steps(ids), on_cursor(cursor))

    def raise_token_floor(self, cursor: Any, floor: int) -> Work:
        return drive(self.raise_token_floor_steps(floor), on_cursor(cursor))

    def drop_idle_nodes(self, cursor: Any, after: str, limit: int) -> Work:
        return drive(self.drop_idle_nodes_steps(after, limit), on_cursor(cursor))
