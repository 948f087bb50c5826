"""PostgreSQL dialect of the database lock backend: the production target.

Layout: node rows that stay between holds, each naming in ``entries`` the
grants that hold it; one ``esdlock_grant`` row per grant (its nodes and
modes, owner, lease, token, intent, checkpoint); waiting markers in
``esdlock_waiter``. Acquire and release are one autocommit call each of a
server-side function (``esdlock_acquire``, ``esdlock_release``: the rules of
``django_esdlock.protocol`` in PL/pgSQL, their source in ``sql/`` and the
rules they keep in ``functions.py``), so a lock pair is two round trips and
two commits whatever the depth, and writes the taken node rows plus one
grant row to acquire and deletes that one row to release. The statements
are in ``queries.py``; waiters are woken by ``LISTEN/NOTIFY`` (``listener``
for a blocking session, ``sessions`` for an event loop's).
"""

from __future__ import annotations

import contextlib
import json
import math
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

from .... import modes
from ....modes import Mode
from ....records import Grant, HolderRecord, Kind, LockRequest, Node
from ....steps import Steps
from ...base import renew_params
from ..dialect import Dialect
from ..rows import node_row, record
from ..statements import Fetch, Statement
from . import listener
from .queries import CLIENT_CHECK_SINCE, SETUP_LOCK_KEY, PostgresSQL
from .sessions import LoopSessions

DEFAULT_PORT = 5432
"""PostgreSQL's port when the settings name none (libpq's default)."""

# Which held modes conflict with each mode: passed to esdlock_release, which
# decides whom a release may free; modes.py stays the only copy of the matrix.
CONFLICTS = json.dumps({mode.value: sorted(m.value for m in modes.conflicting(mode)) for mode in Mode})
SEMAPHORE_CONFLICTS = json.dumps({**json.loads(CONFLICTS), Mode.S.value: [Mode.S.value]})
"""What esdlock_release is told of a semaphore's grant: a slot it frees goes to the head of the queue."""
_CONFLICTS_OF = {mode: ",".join(sorted(m.value for m in modes.conflicting(mode))) for mode in Mode}
"""What esdlock_acquire is told conflicts with each mode asked (comma-separated)."""


def session_network_options(ttl: float) -> dict[str, Any]:
    """The libpq options of a lock session, for a lock TTL of ``ttl`` seconds: a dead peer fails its calls in time.

    ``tcp_user_timeout``: a call whose bytes the server does not acknowledge
    (it is gone, the network is cut) fails after a third of the TTL (1 to
    10 s) instead of the kernel's ~15 minutes of retransmissions, and the
    renewer retries on a new connection within the lease. Keepalives find
    the same on an idle session (one that waits for a notification);
    ``connect_timeout`` bounds reconnecting. A setting in the database's
    OPTIONS wins over these.
    """
    seconds = min(10, max(1, math.floor(ttl / 3)))
    return {
        "tcp_user_timeout": seconds * 1000,
        "keepalives": 1,
        "keepalives_idle": seconds,
        "keepalives_interval": max(1, seconds // 3),
        "keepalives_count": 3,
        "connect_timeout": max(2, seconds),
    }


class PostgresDialect(Dialect):
    """PostgreSQL: acquire, release, renew and takeover are one autocommit statement each."""

    vendor = "postgresql"
    display_name = "PostgreSQL"
    url_schemes = frozenset({"postgres", "postgresql", "pgsql", "psql", "postgis"})
    atomic_calls = True
    supports_notify = True
    async_native = True
    evicts_by_grant = True
    BEGIN = PostgresSQL.BEGIN
    PAGE = PostgresSQL.PAGE
    RECORDS = PostgresSQL.RECORDS
    AFTER = PostgresSQL.AFTER
    NODE_FILTERS = PostgresSQL.NODE_FILTERS
    HOLDER_FILTERS = PostgresSQL.HOLDER_FILTERS

    def connection_options(self, options: dict[str, Any], ttl: float) -> dict[str, Any]:
        ours = session_network_options(ttl)
        # psycopg 3 binds parameters on the server: the calls' arrays are sent
        # as values, not spelled out as SQL text. (Django leaves prepared
        # statements off, for poolers; the statements inside the functions
        # are planned once per session by PL/pgSQL all the same.)
        try:
            import psycopg  # noqa: F401
        except ImportError:  # pragma: no cover - psycopg2
            return {**ours, **options}
        return {"server_side_binding": True, **ours, **options}

    def call_timeout(self, wrapper: Any, cursor: Any, ms: int | None) -> None:
        if ms is None:
            cursor.execute(PostgresSQL.RESET_STATEMENT_TIMEOUT, [])
        else:
            cursor.execute(PostgresSQL.SET_STATEMENT_TIMEOUT, [str(ms)])

    def prepare(self, wrapper: Any, cursor: Any) -> None:
        cursor.execute(PostgresSQL.SESSION, [])
        if wrapper.pg_version >= CLIENT_CHECK_SINCE:
            cursor.execute(PostgresSQL.SESSION_CLIENT_CHECK, [])

    def is_missing_schema(self, error: BaseException) -> bool:
        return getattr(error, "sqlstate", None) in ("42P01", "42883", "42703")  # no such table, function, column

    def failover_risk(self, cursor: Any) -> str | None:
        """Asynchronous standbys: a failover to one loses the commits it had not received when the primary died.

        What a role that may not read the standbys' state still sees: that
        there are standbys, and ``synchronous_standby_names``.
        """
        cursor.execute(PostgresSQL.STANDBYS, [])
        rows = cursor.fetchall()
        if not rows:
            return None  # a lone server: nothing to fail over to (a restart keeps every commit)
        names, commit = rows[0][2], rows[0][3]
        standbys = ", ".join(name or "?" for name, *_ in rows)
        if not names.strip():
            return f"its standbys ({standbys}) are asynchronous: synchronous_standby_names is empty"
        if commit in ("off", "local"):
            return f"the lock sessions' synchronous_commit is {commit!r}: no commit waits for a standby ({standbys})"
        unsafe = [f"{name or '?'} ({state})" for name, state, *_ in rows if state in ("async", "potential")]
        if unsafe:
            return f"standbys that do not confirm every commit: {', '.join(unsafe)}"
        return None

    def driver_notifies(self) -> bool:
        """Whether the driver is psycopg 3.2+, whose ``notifies()`` takes a timeout."""
        try:
            import psycopg
        except ImportError:
            return False
        version = tuple(int(part) for part in psycopg.__version__.split(".")[:2] if part.isdigit())
        return version >= (3, 2)

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        try:
            import psycopg

            return (psycopg.Error,)
        except ImportError:  # pragma: no cover - psycopg2
            import psycopg2

            return (psycopg2.Error,)

    def describe(self, settings_dict: dict[str, Any]) -> str:
        servers = ",".join(f"{host}{':' + str(port) if port else ''}" for host, port in _servers(settings_dict))
        return f"PostgreSQL database {settings_dict['NAME']!r} on {servers or 'local socket'}"

    def endpoints(self, settings_dict: dict[str, Any]) -> tuple[list[tuple[str, int]], str]:
        return [(host or "127.0.0.1", int(port or DEFAULT_PORT)) for host, port in _servers(settings_dict)], ""

    def url_through(self, settings_dict: dict[str, Any], host: str, ports: Sequence[int]) -> str:
        user = urllib.parse.quote(settings_dict.get("USER") or "", safe="")
        password = urllib.parse.quote(settings_dict.get("PASSWORD") or "", safe="")
        auth = f"{user}:{password}@" if password else f"{user}@" if user else ""
        servers = ",".join(f"{host}:{port}" for port in ports)
        # libpq's own options (target_session_attrs of a multi-host alias, sslmode) go with it.
        query = urllib.parse.urlencode(
            {k: v for k, v in settings_dict.get("OPTIONS", {}).items() if isinstance(v, str | int) and k != "pool"}
        )
        name = urllib.parse.quote(settings_dict["NAME"], safe="")
        return f"postgres://{auth}{servers}/{name}{'?' + query if query else ''}"

    @contextlib.contextmanager
    def setup_guard(self, wrapper: Any, settings_dict: dict[str, Any]) -> Iterator[None]:
        """An advisory lock of the session, for the time of the migrations."""
        with wrapper.cursor() as cursor:
            cursor.execute(PostgresSQL.SETUP_LOCK, [SETUP_LOCK_KEY])
        try:
            yield
        finally:
            with wrapper.cursor() as cursor:
                cursor.execute(PostgresSQL.SETUP_UNLOCK, [SETUP_LOCK_KEY])

    def listening(self, wrapper: Any) -> bool:
        return listener.listening(wrapper)

    def listen(self, wrapper: Any, cursor: Any) -> None:
        listener.listen(wrapper, cursor)

    def wait_for_release(self, wrapper: Any, timeout: float) -> bool:
        return listener.wait(wrapper, timeout)

    def loop_sessions(self, wrapper: Any, size: int) -> LoopSessions:
        params = wrapper.get_connection_params()
        for django_only in ("cursor_factory", "context"):  # a blocking cursor class, Django's type loaders
            params.pop(django_only, None)
        return LoopSessions(params, size)

    # The operations an event loop sends too (see ``sessions``): each is
    # written once as steps, driven on the blocking cursor by the Dialect's
    # methods and on the loop's sessions by LoopSessions.run.

    def acquire_steps(self, request: LockRequest, nodes: list[Node], marker_ttl_ms: int) -> Steps[Grant | None]:
        ids, namespaces, kinds, keys, parents, depths = (
            list(column) for column in zip(*map(node_row, nodes), strict=True)
        )
        asked = dict(request.targets)
        params = {
            "ids": ids,
            "namespaces": namespaces,
            "kinds": kinds,
            "keys": keys,
            "parents": parents,
            "depths": depths,
            "modes": [asked[node].value for node in nodes],
            "conflicts": [_CONFLICTS_OF[asked[node]] for node in nodes],
            "holder_id": request.holder_id,
            "owner": json.dumps(request.owner.as_dict(), separators=(",", ":")),
            "owner_key": request.owner.key,
            "ttl_ms": request.ttl_ms,
            "intent": None if request.intent is None else json.dumps(request.intent, separators=(",", ":")),
            "reentrant": [node.id for node in nodes if request.may_reenter(node)],  # the ids it may reenter
            "ticket": request.ticket,
            "marker_ttl_ms": marker_ttl_ms,
            "lock_delay_ms": self.lock_delay_ms,
            "holder_limit": request.holder_limit,
        }
        token, taken, holder_limit = yield Statement(PostgresSQL.ACQUIRE, params, Fetch.ONE)
        if taken is None:
            return None
        taken_ids = set(taken)
        taken_nodes = tuple(node for node in nodes if node.id in taken_ids)
        return Grant(request=request, token=token, taken=taken_nodes, holder_limit=holder_limit)

    def release_steps(
        self, holder_id: str, owner_key: str | None, released: Sequence[tuple[Node, Mode | None]]
    ) -> Steps[bool]:
        # The grant row names its nodes: ``released`` is not sent.
        semaphore = any(node.kind is Kind.SEMAPHORE for node, _ in released)
        params = {
            "holder_id": holder_id,
            "owner_key": owner_key,
            "conflicts": SEMAPHORE_CONFLICTS if semaphore else CONFLICTS,
        }
        row = yield Statement(PostgresSQL.RELEASE, params, Fetch.ONE)
        return bool(row[0])

    def withdraw_steps(self, request: LockRequest) -> Steps[None]:
        ids = sorted({node.id for node, _ in request.targets})
        yield Statement(PostgresSQL.WITHDRAW, {"ids": ids, "holder_id": request.holder_id})

    def renew_steps(self, grant: Grant, checkpoint: str | None, recovery: str | None) -> Steps[bool]:
        renewed = yield Statement(PostgresSQL.RENEW, renew_params(grant, checkpoint, recovery), Fetch.ROWCOUNT)
        return renewed == 1

    # Only the blocking API sends these (the async API in a worker thread).

    def renew_many_steps(self, grants: Sequence[Grant]) -> Steps[tuple[list[bool], bool]]:
        ordered = sorted(grants, key=lambda grant: grant.request.holder_id)
        params = {
            "holder_ids": [grant.request.holder_id for grant in ordered],
            "owner_keys": [grant.request.owner.key for grant in ordered],
            "ttl_ms": [grant.request.ttl_ms for grant in ordered],
            "tokens": [grant.token for grant in ordered],
        }
        rows = yield Statement(PostgresSQL.RENEW_MANY, params, Fetch.ALL)
        renewed = {row[0] for row in rows}
        return [grant.request.holder_id in renewed for grant in grants], False

    def take_over_steps(
        self, ids: list[str], params: dict[str, Any]
    ) -> Steps[tuple[tuple[int, set[str]] | None, bool]]:
        row = yield Statement(PostgresSQL.TAKE_OVER, params, Fetch.ONE)
        if row is None:
            return None, False
        return (row[0], set(row[1]) & set(ids)), False

    def evict_steps(self, rows: list[Sequence[Any]], grace_ms: int) -> Steps[tuple[list[HolderRecord], bool]]:
        holder_ids = sorted({row[4] for row in rows})
        yield Statement(PostgresSQL.LOCK_GRANTS, {"holder_ids": holder_ids})
        evicted = yield Statement(PostgresSQL.EVICT, {"holder_ids": holder_ids, "grace_ms": grace_ms}, Fetch.ALL)
        return [record(row) for row in evicted], True

    def drop_expired_markers_steps(self) -> Steps[tuple[None, bool]]:
        yield Statement(PostgresSQL.DROP_EXPIRED_MARKERS, {})
        return None, False

    def wait_state_steps(self, ids: list[str] | None) -> Steps[tuple[tuple[list[Any], list[Any]], bool]]:
        markers = yield Statement(PostgresSQL.WAITERS, {"all": ids is None, "ids": ids or []}, Fetch.ALL)
        on = sorted({row[0] for row in markers})
        query = PostgresSQL.RECORDS.replace("{nodes}", PostgresSQL.NODE_FILTERS["on_nodes"]).replace(
            "{holders}", PostgresSQL.HOLDER_FILTERS["blocking"]
        )
        holders = yield Statement(query, {"ids": on}, Fetch.ALL)
        return (markers, holders), False

    def raise_token_floor_steps(self, floor: int) -> Steps[tuple[bool, bool]]:
        row = yield Statement(PostgresSQL.RAISE_TOKEN_FLOOR, {"floor": floor}, Fetch.ONE)
        return row is not None, False

    def drop_idle_nodes_steps(self, after: str, limit: int) -> Steps[tuple[tuple[int, str], bool]]:
        rows = yield Statement(PostgresSQL.LOCK_IDLE_NODES, {"after": after, "limit": limit}, Fetch.ALL)
        ids = [row[0] for row in rows]
        if ids:
            yield Statement(PostgresSQL.DELETE_IDLE_NODES, {"ids": ids})
        return (len(ids), ids[-1] if ids else after), True

    def find_evictable_steps(
        self, namespace: str | None, grace_ms: int, after: str, limit: int
    ) -> Steps[tuple[tuple[list[Sequence[Any]], list[str]], bool]]:
        page = {"grace_ms": grace_ms, "after": after, "limit": limit}
        page_rows = yield Statement(PostgresSQL.EVICTABLE_PAGE, page, Fetch.ALL)
        holder_ids = [row[0] for row in page_rows]
        if not holder_ids:
            return ([], []), False
        params = {"holder_ids": holder_ids, "namespace": namespace}
        record_rows = yield Statement(PostgresSQL.GRANT_RECORDS, params, Fetch.ALL)
        return (record_rows, holder_ids), False


def _servers(settings_dict: dict[str, Any]) -> list[tuple[str, str]]:
    """The (host, port) of each server the settings name: libpq's multi-host form, ``HOST`` "h1,h2" with ``PORT``
    "p1,p2" (or one port for every host)."""
    hosts = str(settings_dict.get("HOST") or "").split(",")
    ports = str(settings_dict.get("PORT") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return [(host.strip(), port.strip()) for host, port in zip(hosts, ports, strict=False) if host.strip() or port]
