"""Database lock store: lock rows in SQL tables, taken with SELECT ... FOR UPDATE, the JDBC way.

PostgreSQL is the production target: one short transaction per acquire on the
backend's own connection (per thread), node rows created race-free and locked
in one global order (see ``database_sql``), fencing tokens from a sequence,
waiters woken by ``LISTEN/NOTIFY``.

SQLite is the zero-setup embedded default and keeps the same semantics on one
machine, within these limits:

- one machine only: the database file must be on a local disk (not NFS);
- every lock write takes SQLite's single write lock (``BEGIN IMMEDIATE``), so
  lock traffic is serialized and queues for up to the busy timeout
  (OPTIONS ``timeout``, default 20 s here) before ``LockBackendUnavailable``;
- the file is switched to WAL journal mode (a persistent setting) so that a
  caller's open read transaction does not block lock writes;
- a lock taken inside a transaction that has already *written* to the same
  SQLite file waits for that transaction's write lock, i.e. for the busy
  timeout, then fails: take locks before writing, or keep locks in a file of
  their own (``LOCK_BACKEND = "sqlite:////var/lib/app/locks.sqlite3"``);
- no notification: waiters poll with capped exponential backoff.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import functools
import hashlib
import json
import logging
import os
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import environ
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.db import Error as DjangoDatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import ConnectionDoesNotExist, ConnectionHandler, load_backend

from .. import modes, paths
from ..exceptions import LockBackendUnavailable
from ..modes import Mode
from ..records import Grant, HolderPage, HolderRecord, Kind, LockRequest, Node, Owner, from_epoch_ms
from .base import BaseLockBackend, backoff_delay, takeover_request
from .database_sql import NOTIFY_CHANNEL, SETUP_LOCK_KEY, PostgresSQL, SQLiteSQL

logger = logging.getLogger("django_esdlock")

T = TypeVar("T")

APP_LABEL = "django_esdlock"
URL_ALIAS = "django_esdlock"
"""The alias the lock connection of a ``url`` configuration goes by (logs, routers, migrations)."""

SQLITE_BUSY_TIMEOUT = 20.0
"""Seconds a SQLite lock transaction waits for the write lock, unless OPTIONS['timeout'] says otherwise."""

SQLITE_WAL_SWITCH_TIMEOUT_MS = 200

NOTIFY_QUEUED_POLL_CAP = 0.1
"""Longest sleep of a queued waiter that listens (see ``BaseLockBackend.queued_poll_cap``)."""

NOTIFY_FALLBACK_INITIAL = 0.05
NOTIFY_FALLBACK_CAP = 2.0
"""Longest wait between attempts while listening: a lease that runs out sends no notification."""

LISTENER_START_TIMEOUT = 5.0
LISTENER_RETRY_DELAY = 1.0
"""Seconds before a failed listener is started again; waiters poll meanwhile."""

NOTIFY_PAYLOAD_LIMIT = 7900
"""PostgreSQL refuses payloads of 8000 bytes and more; past this, a release wakes every waiter."""

_SUPPORTED_VENDORS = ("postgresql", "sqlite")

# What a forked child inherited: never used, never closed (closing would end
# the parent's sessions), kept from the garbage collector for the same reason.
_inherited: list[Any] = []


def node_tag(node_id: str) -> str:
    """Return the short tag a release notification names a node by."""
    return hashlib.blake2b(node_id.encode(), digest_size=6).hexdigest()


def _encode_cursor(values: Sequence[str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values)).encode()).decode()


def _decode_cursor(cursor: str) -> tuple[str, str, str]:
    try:
        namespace, kind, key = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return str(namespace), str(kind), str(key)
    except (ValueError, TypeError) as e:
        raise ValueError(f"not a holder page cursor: {cursor!r}") from e


def _json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _unjson(value: Any) -> Any:
    if value is None or isinstance(value, (dict, list)):
        return value
    return json.loads(value)


def _record(row: Sequence[Any]) -> HolderRecord:
    namespace, kind, key, _node_id, holder_id, mode, owner, token, acquired_ms, expires_ms, *json_columns = row
    intent, checkpoint, recovery = (_unjson(value) for value in json_columns)
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
    )


def _node_row(node: Node) -> tuple[str, str, str, str, str, int]:
    tree = node.kind is Kind.TREE
    parent = (paths.parent(node.key) or "") if tree else ""
    return node.id, node.namespace, node.kind.value, node.key, parent, node.key.count("/") if tree else 0


class Decision(NamedTuple):
    """What an attempt does: write ``writes`` (a grant), or nothing, leaving markers on ``refused``."""

    writes: list[tuple[Node, Mode]]
    refused: list[tuple[Node, Mode]]


def decide(request: LockRequest, holders: Sequence[Sequence[Any]], waiters: Sequence[Sequence[Any]] = ()) -> Decision:
    """Judge a request against the holders and live waiting markers of its nodes (SQLite's copy of
    the ``esdlock_acquire`` function of PostgreSQL, and of the Elasticsearch acquire script).

    ``holders`` are rows ``(node_id, holder_id, mode, owner_key, has_intent,
    live)``, ``waiters`` rows ``(node_id, holder_id, mode, ticket)``. A holder
    counts if it is live or carries an intent (it awaits recovery); the
    request's own holder id never counts (a retry replaces it). A reentrant
    request skips a node its owner already holds live in the same mode, as
    Elasticsearch's ``noop`` does. A marker of another request in a
    conflicting mode refuses a request queued after it (no ticket, or a
    larger one) unless the requester's owner holds the node.
    """
    by_node: dict[str, list[Sequence[Any]]] = collections.defaultdict(list)
    for row in holders:
        by_node[row[0]].append(row)
    markers: dict[str, list[Sequence[Any]]] = collections.defaultdict(list)
    for row in waiters:
        markers[row[0]].append(row)
    writes, refused = [], []
    for node, mode in dict(request.targets).items():
        reentered = blocked = inside = False
        for _node_id, holder_id, held_mode, owner_key, has_intent, live in by_node[node.id]:
            if holder_id == request.holder_id or not (live or has_intent):
                continue
            inside = inside or (live and owner_key == request.owner.key)
            if request.reentrant and live and owner_key == request.owner.key and held_mode == mode.value:
                reentered = True
            elif not modes.compatible(held_mode, mode):
                blocked = True
        if not inside:
            blocked = blocked or any(
                holder_id != request.holder_id
                and not modes.compatible(marker_mode, mode)
                and (request.ticket is None or ticket < request.ticket)
                for _node_id, holder_id, marker_mode, ticket in markers[node.id]
            )
        if reentered:
            continue
        (refused if blocked else writes).append((node, mode))
    return Decision([] if refused else writes, refused)


class _ThreadConnection:
    """The lock connection of one thread, closed when the thread ends and drops its locals."""

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self.wrapper = wrapper
        self.pid = os.getpid()

    def __del__(self) -> None:
        if self.pid == os.getpid():  # a forked child must not end its parent's session
            with contextlib.suppress(Exception):
                self.wrapper.close()


class _Listener:
    """One LISTEN connection per backend and process, shared by its waiting threads.

    A thread reads :attr:`seq` before it tries to acquire and passes it to
    :meth:`wait`, so a release announced between the attempt and the wait is
    not missed. (Re)connecting counts as an announcement of every node: what
    was released while nobody listened is unknown.
    """

    HISTORY = 512

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._cond = threading.Condition()
        self._seq = 0
        self._events: collections.deque[tuple[int, frozenset[str] | None]] = collections.deque(maxlen=self.HISTORY)
        self._stopping = threading.Event()
        self._settled = threading.Event()
        self.alive = False
        self.ended_at = 0.0
        self._thread: threading.Thread | None = None

    @property
    def seq(self) -> int:
        return self._seq

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="django-esdlock-listener", daemon=True)
        self._thread.start()

    def ready(self, timeout: float) -> bool:
        """Wait until LISTEN is in place (True) or failed (False), at most ``timeout`` seconds."""
        self._settled.wait(timeout)
        return self.alive

    @property
    def ended(self) -> bool:
        return self._settled.is_set() and not self.alive

    def stop(self) -> None:
        self._stopping.set()

    def _announce(self, tags: frozenset[str] | None) -> None:
        with self._cond:
            self._seq += 1
            self._events.append((self._seq, tags))
            self._cond.notify_all()

    def _run(self) -> None:
        connection = None
        try:
            connection = self._connect()
            connection.autocommit = True
            connection.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self.alive = True
            self._announce(None)
            self._settled.set()
            while not self._stopping.is_set():
                for notify in connection.notifies(timeout=0.5):
                    payload = notify.payload
                    self._announce(None if payload == "*" else frozenset(payload.split(",")))
        except Exception as e:  # noqa: BLE001 - any failure: waiters fall back to backoff
            if not self._stopping.is_set():
                logger.info("lock release listener stopped: %s", e)
        finally:
            self.alive = False
            self.ended_at = time.monotonic()
            self._settled.set()
            self._announce(None)  # wake waiters, who then fall back to backoff
            if connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()

    def wait(self, tags: frozenset[str], since: int | None, timeout: float) -> bool:
        """Block until a release of one of ``tags`` is announced after ``since``; False on timeout."""

        def announced() -> bool:
            if since is None or not self._events or self._events[0][0] > since + 1:
                return True  # unknown start, or history lost: assume a release
            return any(seq > since and (named is None or named & tags) for seq, named in reversed(self._events))

        with self._cond:
            return self._cond.wait_for(announced, timeout=max(0.0, timeout))


class DatabaseLockBackend(BaseLockBackend):
    """Locks as rows of the ``esdlock_node`` and ``esdlock_holder`` tables of a SQL database.

    OPTIONS: exactly one of ``using`` (a ``DATABASES`` alias) or ``url`` (a
    ``postgres://`` or ``sqlite:///`` URL, as django-environ reads it).
    PostgreSQL and SQLite are supported. Lock state lives on connections of
    the backend's own, one per thread, in autocommit with short explicit
    transactions: never on the caller's connection or in its transaction.
    """

    def __init__(self, *, ttl: float = 30.0, using: str | None = None, url: str | None = None, **options: Any) -> None:
        super().__init__(ttl=ttl)
        if options:
            raise ImproperlyConfigured(
                f"DatabaseLockBackend got unknown OPTIONS {', '.join(sorted(options))}; use 'using' or 'url'"
            )
        if (using is None) == (url is None):
            raise ImproperlyConfigured("DatabaseLockBackend needs exactly one of OPTIONS 'using' (an alias) or 'url'")
        self.using = using
        self.url = url
        self._url_settings: dict[str, Any] | None = None
        if url is not None:
            try:
                config = environ.Env.db_url_config(_without_ttl(url))
            except Exception as e:
                raise ImproperlyConfigured(f"DatabaseLockBackend OPTIONS['url'] is not a database URL: {e}") from e
            # A private handler fills in Django's defaults, as for DATABASES.
            self._url_settings = ConnectionHandler({DEFAULT_DB_ALIAS: {}, URL_ALIAS: config}).settings[URL_ALIAS]
        elif using not in connections.settings:
            raise ImproperlyConfigured(f"DatabaseLockBackend OPTIONS['using'] names no database: {using!r}")
        settings_dict = self._base_settings()
        try:
            wrapper_class = load_backend(settings_dict["ENGINE"]).DatabaseWrapper
        except (ImproperlyConfigured, ImportError) as e:  # some Django versions let a driver's ImportError out
            raise ImproperlyConfigured(
                f"DatabaseLockBackend cannot load database engine {settings_dict['ENGINE']!r}: {e}"
            ) from e
        self.vendor: str = wrapper_class.vendor
        if self.vendor not in _SUPPORTED_VENDORS:
            raise ImproperlyConfigured(
                f"DatabaseLockBackend supports PostgreSQL and SQLite, not {wrapper_class.display_name} "
                f"({settings_dict['ENGINE']})"
            )
        if self.vendor == "sqlite" and str(settings_dict["NAME"]) in ("", ":memory:"):
            raise ImproperlyConfigured("DatabaseLockBackend needs a SQLite database file, not an in-memory database")
        self.sql: type[PostgresSQL] | type[SQLiteSQL] = PostgresSQL if self.vendor == "postgresql" else SQLiteSQL
        self.supports_notify = self.vendor == "postgresql" and _psycopg3()
        if self.supports_notify:  # a release wakes waiters; polling only catches leases that ran out
            self.queued_poll_cap = NOTIFY_QUEUED_POLL_CAP
        self._local = threading.local()
        self._lock = threading.Lock()
        # Weak: a thread's connection goes with the thread (see _ThreadConnection).
        self._wrappers: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()
        self._pid = os.getpid()
        self._listener: _Listener | None = None
        self._schema_ready = False

    def describe(self) -> str:
        s = self._base_settings()
        if self.vendor == "sqlite":
            where = f"SQLite {s['NAME']}"
        else:
            host = s["HOST"] or "local socket"
            where = f"PostgreSQL database {s['NAME']!r} on {host}{':' + str(s['PORT']) if s['PORT'] else ''}"
        return where if self.using is None else f"{where} (alias {self.using!r})"

    # --- connections -----------------------------------------------------------

    def _base_settings(self) -> dict[str, Any]:
        if self._url_settings is not None:
            return self._url_settings
        # Read at each new connection: test runners rename databases at run time.
        return connections.settings[self.using]

    def _new_wrapper(self) -> BaseDatabaseWrapper:
        base = self._base_settings()
        options = {k: v for k, v in base["OPTIONS"].items() if k != "pool"}  # one long-lived connection per thread
        if self.vendor == "sqlite":
            options.setdefault("timeout", SQLITE_BUSY_TIMEOUT)
        settings_dict = {**base, "OPTIONS": options, "AUTOCOMMIT": True, "ATOMIC_REQUESTS": False}
        wrapper = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(settings_dict, self.using or URL_ALIAS)
        wrapper.inc_thread_sharing()  # close() may come from another thread
        return wrapper

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """The lock connection of the calling thread: never the caller's own ``connections[alias]``.

        Opened on first query, closed when the thread ends or by :meth:`close`.
        A forked child leaves what it inherited alone and opens its own.
        """
        self._forget_inherited()
        held = getattr(self._local, "connection", None)
        if held is None:
            held = self._local.connection = _ThreadConnection(self._new_wrapper())
            with self._lock:
                self._wrappers.add(held.wrapper)
        return held.wrapper

    def _forget_inherited(self) -> None:
        if self._pid != os.getpid():
            with self._lock:
                # Kept, never closed: closing would end the parent's sessions.
                _inherited.extend([self._local, *self._wrappers])
                self._wrappers = weakref.WeakSet()
                self._local = threading.local()
                self._listener = None
                self._pid = os.getpid()

    def close(self) -> None:
        with self._lock:
            wrappers, self._wrappers = list(self._wrappers), weakref.WeakSet()
            listener, self._listener = self._listener, None
            self._local = threading.local()
            ours = self._pid == os.getpid()
        if listener is not None:
            listener.stop()
        if ours:
            for wrapper in wrappers:
                with contextlib.suppress(Exception):
                    wrapper.close()

    def _prepare(self, wrapper: BaseDatabaseWrapper) -> None:
        """Open the connection if needed and set up a new one for lock work."""
        if wrapper.connection is not None and getattr(wrapper, "_esdlock_prepared", None) is wrapper.connection:
            return
        wrapper.ensure_connection()
        with wrapper.cursor() as cursor:
            if self.vendor == "postgresql":
                cursor.execute(PostgresSQL.SESSION, [])
                if wrapper.pg_version >= PostgresSQL.CLIENT_CHECK_SINCE:  # type: ignore[attr-defined]
                    cursor.execute(PostgresSQL.SESSION_CLIENT_CHECK, [])
            else:
                cursor.execute(SQLiteSQL.JOURNAL_MODE, [])
                if cursor.fetchone()[0] != "wal":
                    # Briefly: a caller's open transaction on the file makes the
                    # switch wait, and the switch is only an improvement.
                    timeout_ms = round(float(wrapper.settings_dict["OPTIONS"]["timeout"]) * 1000)
                    cursor.execute(f"PRAGMA busy_timeout = {SQLITE_WAL_SWITCH_TIMEOUT_MS}", [])
                    with contextlib.suppress(DjangoDatabaseError):
                        cursor.execute(SQLiteSQL.USE_WAL, [])
                    cursor.execute(f"PRAGMA busy_timeout = {timeout_ms:d}", [])
        wrapper._esdlock_prepared = wrapper.connection  # type: ignore[attr-defined]

    def _discard(self, wrapper: BaseDatabaseWrapper) -> None:
        """Close a connection left in an unknown state; the next use opens a new one."""
        with contextlib.suppress(Exception):
            wrapper.close()
        wrapper.connection = None

    def _is_missing_schema(self, error: BaseException) -> bool:
        cause: BaseException | None = error
        while cause is not None:  # ours, then Django's, then the driver's
            if getattr(cause, "sqlstate", None) in ("42P01", "42883"):  # PostgreSQL: no such table, function
                return True
            if self.vendor == "sqlite" and "no such table: esdlock_" in str(cause):
                return True
            cause = cause.__cause__
        return False

    @contextlib.contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """Turn driver and connection failures into LockBackendUnavailable: the one place that does."""
        try:
            yield
        except LockBackendUnavailable:
            raise
        except (DjangoDatabaseError, *_driver_errors(self.vendor)) as e:
            raise LockBackendUnavailable(f"{self.describe()} failed to {action}: {e}") from e

    def _run(
        self, action: str, work: Callable[[Any], tuple[T, bool]], *, transaction: bool = True, begin: bool = True
    ) -> T:
        """Run ``work(cursor)`` on this thread's lock connection; commit if it returns ``(value, True)``.

        With ``transaction`` the work runs between BEGIN and COMMIT/ROLLBACK;
        any failure rolls back (the server does, if the connection died).
        Without ``begin`` the work opens the transaction itself (it sends
        ``BEGIN;`` with its first statement, saving a round trip). If the lock
        tables do not exist yet they are created and the work is run once more.
        """
        wrapper = self.connection
        for first_try in (True, False):
            try:
                with self._translate(action):
                    return self._run_once(wrapper, work, transaction, begin)
            except LockBackendUnavailable as e:
                if first_try and not self._schema_ready and self._is_missing_schema(e):
                    logger.info("creating the lock tables in %s", self.describe())
                    self.setup()
                    continue
                raise
        raise AssertionError("unreachable")

    def _run_once(
        self, wrapper: BaseDatabaseWrapper, work: Callable[[Any], tuple[T, bool]], transaction: bool, begin: bool
    ) -> T:
        try:
            self._prepare(wrapper)
            with wrapper.cursor() as cursor:
                if not transaction:
                    return work(cursor)[0]
                if begin:
                    cursor.execute(self.sql.BEGIN, [])
                try:
                    value, commit = work(cursor)
                except BaseException:
                    with contextlib.suppress(Exception):  # the first error is the one to report
                        cursor.execute(self.sql.ROLLBACK, [])
                    raise
                cursor.execute(self.sql.COMMIT if commit else self.sql.ROLLBACK, [])
                return value
        except BaseException:
            # Whether the rollback failed, the connection broke or the thread
            # was interrupted mid-transaction: never reuse this connection.
            self._discard(wrapper)
            raise

    # --- schema ---------------------------------------------------------------

    def setup(self) -> None:
        """Apply django_esdlock's migrations to the lock database unless they are applied."""
        from django.db.migrations.executor import MigrationExecutor

        wrapper = self.connection
        with self._translate("create the lock tables"), _as_django_connection(wrapper):
            self._prepare(wrapper)
            with self._setup_guard(wrapper):
                for last_try in (False, True):
                    executor = MigrationExecutor(wrapper)
                    targets = executor.loader.graph.leaf_nodes(APP_LABEL)
                    if not targets:
                        raise ImproperlyConfigured(f"'{APP_LABEL}' must be in INSTALLED_APPS to create its tables")
                    plan = executor.migration_plan(targets)
                    if not plan:
                        break
                    try:
                        executor.migrate(targets, plan=plan)
                        break
                    except DjangoDatabaseError:
                        # SQLite: another process created them meanwhile; look again.
                        if last_try or self.vendor != "sqlite":
                            raise
        self._schema_ready = True

    @contextlib.contextmanager
    def _setup_guard(self, wrapper: BaseDatabaseWrapper) -> Iterator[None]:
        if self.vendor != "postgresql":
            yield
            return
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [SETUP_LOCK_KEY])
        try:
            yield
        finally:
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [SETUP_LOCK_KEY])

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Report an unreachable lock database, when the check runs for databases.

        Like Django's own database checks, this connects only when the
        command asks for database checks (``check --database``, ``migrate``):
        other commands must work without the database.
        """
        databases = kwargs.get("databases")
        if not databases or (self.using is not None and self.using not in databases):
            return []

        def reach(cursor: Any) -> tuple[None, bool]:
            cursor.execute(self.sql.CHECK, [])
            return None, False

        try:
            self._run("reach the database", reach, transaction=False)
        except LockBackendUnavailable as e:
            return [
                checks.Error(
                    str(e),
                    hint="Start the database or fix LOCK_BACKEND['OPTIONS'].",
                    id="django_esdlock.E002",
                )
            ]
        return []

    # --- the primitive ------------------------------------------------------

    def acquire(self, request: LockRequest) -> Grant | None:
        listener = self._listener
        if listener is not None:
            # Read before the attempt, so that wait() sees a release that comes after it.
            self._local.notify_seen = (listener, listener.seq)
        nodes = sorted(dict(request.targets), key=lambda node: node.id)
        if self.vendor == "postgresql":
            work = functools.partial(self._acquire_postgres, request=request, nodes=nodes)
            return self._run("acquire", work, begin=False)
        return self._run("acquire", functools.partial(self._acquire_sqlite, request=request, nodes=nodes))

    def _acquire_postgres(self, cursor: Any, request: LockRequest, nodes: list[Node]) -> tuple[Grant | None, bool]:
        ids, namespaces, kinds, keys, parents, depths = (
            list(column) for column in zip(*map(_node_row, nodes), strict=True)
        )
        asked = dict(request.targets)
        # BEGIN and the call in one round trip; COMMIT only once the grant has
        # reached us: a client that vanishes mid-call leaves nothing held.
        cursor.execute(
            PostgresSQL.ACQUIRE,
            {
                "ids": ids,
                "namespaces": namespaces,
                "kinds": kinds,
                "keys": keys,
                "parents": parents,
                "depths": depths,
                "modes": [asked[node].value for node in nodes],
                "conflicts": [",".join(sorted(m.value for m in modes.conflicting(asked[node]))) for node in nodes],
                "holder_id": request.holder_id,
                "owner": _json(request.owner.as_dict()),
                "owner_key": request.owner.key,
                "ttl_ms": request.ttl_ms,
                "intent": _json(request.intent),
                "reentrant": request.reentrant,
                "ticket": request.ticket,
                "marker_ttl_ms": self.marker_ttl_ms,
            },
        )
        cursor.nextset()
        token, taken, wrote = cursor.fetchone()
        if taken is None:
            return None, wrote  # commit only the waiting markers it left, if any
        taken_ids = set(taken)
        return Grant(request=request, token=token, taken=tuple(node for node in nodes if node.id in taken_ids)), True

    def _acquire_sqlite(self, cursor: Any, request: LockRequest, nodes: list[Node]) -> tuple[Grant | None, bool]:
        now = self._sqlite_now(cursor)
        ids = json.dumps([node.id for node in nodes])
        cursor.execute(SQLiteSQL.READ_HOLDERS, {"ids": ids, "now": now})
        holders = cursor.fetchall()
        cursor.execute(SQLiteSQL.READ_WAITERS, {"ids": ids, "now": now})
        decision = decide(request, holders, cursor.fetchall())
        if decision.refused:
            if request.ticket is None:
                return None, False
            marker = {
                "refused": json.dumps([[node.id, mode.value] for node, mode in decision.refused]),
                "holder_id": request.holder_id,
                "ticket": request.ticket,
                "renew_before": self._sqlite_time(cursor, now, self.marker_ttl_ms // 2),
            }
            offset = _sqlite_offset(self.marker_ttl_ms)
            cursor.execute(SQLiteSQL.WRITE_MARKERS, {**marker, "now": now, "offset": offset})
            return None, cursor.rowcount > 0  # commit only markers it left or renewed
        cursor.execute(SQLiteSQL.CREATE_NODES, {"nodes": json.dumps([_node_row(node) for node in nodes])})
        cursor.execute(SQLiteSQL.EVICT_FOR_ACQUIRE, {"ids": ids, "holder_id": request.holder_id, "now": now})
        if request.ticket is not None:
            cursor.execute(SQLiteSQL.DROP_MARKERS, {"ids": ids, "holder_id": request.holder_id, "now": now})
        token = self._sqlite_token(cursor)
        cursor.execute(
            SQLiteSQL.WRITE_HOLDERS,
            {
                "taken": json.dumps([[node.id, mode.value] for node, mode in decision.writes]),
                "holder_id": request.holder_id,
                "owner": _json(request.owner.as_dict()),
                "owner_key": request.owner.key,
                "token": token,
                "now": now,
                "offset": _sqlite_offset(request.ttl_ms),
                "intent": _json(request.intent),
            },
        )
        return Grant(request=request, token=token, taken=tuple(node for node, _ in decision.writes)), True

    @staticmethod
    def _sqlite_now(cursor: Any) -> str:
        cursor.execute(SQLiteSQL.NOW, [])
        return cursor.fetchone()[0]

    @staticmethod
    def _sqlite_token(cursor: Any) -> int:
        cursor.execute(SQLiteSQL.NEXT_TOKEN, [])
        cursor.execute(SQLiteSQL.READ_TOKEN, [])
        return cursor.fetchone()[0]

    def release(self, grant: Grant) -> bool:
        asked = dict(grant.request.targets)
        released = [(node, asked[node]) for node in grant.taken]
        return self._release(grant.request.holder_id, grant.request.owner.key, released)

    def force_release(self, holder_id: str, nodes: Sequence[Node]) -> bool:
        return self._release(holder_id, None, [(node, None) for node in nodes])

    def _release(self, holder_id: str, owner_key: str | None, released: Sequence[tuple[Node, Mode | None]]) -> bool:
        """Remove ``holder_id`` (of ``owner_key``, or anyone's) from the nodes; True if it was on all.

        The modes, where known, only narrow whom the release notification wakes.
        """
        ids = sorted({node.id for node, _ in released})
        if not ids:
            return True
        params = {"ids": ids, "holder_id": holder_id, "owner_key": owner_key}

        def work(cursor: Any) -> tuple[bool, bool]:
            if self.vendor == "postgresql":
                cursor.execute(PostgresSQL.RELEASE, {**params, "payload": _payload(released)})
                removed = cursor.fetchone()[0]
            else:
                now = self._sqlite_now(cursor)
                id_list = json.dumps(ids)
                cursor.execute(SQLiteSQL.RELEASE_HOLDER, {**params, "ids": id_list})
                removed = cursor.rowcount
                cursor.execute(SQLiteSQL.EVICT_EXPIRED_ON, {"ids": id_list, "cutoff": now})
                cursor.execute(SQLiteSQL.DELETE_EMPTY_NODES, {"ids": id_list})
            return removed == len(ids), True

        # PostgreSQL: one call of a server-side function, committed on its own.
        return self._run("release", work, transaction=self.vendor != "postgresql")

    def withdraw(self, request: LockRequest) -> None:
        ids = sorted({node.id for node, _ in request.targets})
        params = {"holder_id": request.holder_id}

        def work(cursor: Any) -> tuple[None, bool]:
            if self.vendor == "postgresql":
                cursor.execute(PostgresSQL.WITHDRAW, {**params, "ids": ids})
            else:
                cursor.execute(SQLiteSQL.WITHDRAW, {**params, "ids": json.dumps(ids)})
            return None, True

        self._run("withdraw waiting markers", work, transaction=self.vendor != "postgresql")

    def renew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
    ) -> bool:
        ids = sorted({node.id for node in grant.taken})
        if not ids:
            return True
        params = {
            "holder_id": grant.request.holder_id,
            "owner_key": grant.request.owner.key,
            "ttl_ms": grant.request.ttl_ms,
            "token": grant.token,
            "checkpoint": _json(checkpoint),
            "recovery": _json(recovery),
        }

        def work(cursor: Any) -> tuple[bool, bool]:
            if self.vendor == "postgresql":
                cursor.execute(PostgresSQL.LOCK_NODES_FOR_UPDATE, {"ids": ids})
                cursor.execute(PostgresSQL.RENEW, {**params, "ids": ids})
            else:
                now = self._sqlite_now(cursor)
                offset = _sqlite_offset(grant.request.ttl_ms)
                cursor.execute(SQLiteSQL.RENEW, {**params, "ids": json.dumps(ids), "now": now, "offset": offset})
            return cursor.rowcount == len(ids), True

        return self._run("renew", work)

    def take_over(
        self,
        records: Sequence[HolderRecord],
        owner: Owner,
        *,
        ttl: float,
        recovery: dict[str, Any],
        require_expired: bool = True,
    ) -> Grant | None:
        records, arbiter, request = takeover_request(records, owner, ttl)
        ids = [r.node.id for r in records]
        params = {
            "arbiter": arbiter.node.id,
            "holder_id": arbiter.holder_id,
            "expected_owner_key": arbiter.owner.get("key"),
            "require_expired": require_expired,
            "owner": _json(owner.as_dict()),
            "owner_key": owner.key,
            "recovery": _json(recovery),
            "ttl_ms": request.ttl_ms,
        }

        def work(cursor: Any) -> tuple[tuple[int, set[str]] | None, bool]:
            if self.vendor == "postgresql":
                cursor.execute(PostgresSQL.LOCK_NODES_FOR_UPDATE, {"ids": ids})
                cursor.execute(PostgresSQL.TAKE_OVER, {**params, "ids": ids})
                rows = cursor.fetchall()
                if not rows:
                    return None, False
                return (rows[0][1], {row[0] for row in rows}), True
            now = self._sqlite_now(cursor)
            cursor.execute(SQLiteSQL.TAKE_OVER_ARBITER, {**params, "now": now})
            if cursor.fetchone() is None:
                return None, False
            id_list = json.dumps(ids)
            cursor.execute(SQLiteSQL.TAKE_OVER_TAKEN, {"ids": id_list, "holder_id": arbiter.holder_id})
            taken = {row[0] for row in cursor.fetchall()}
            token = self._sqlite_token(cursor)
            offset = _sqlite_offset(request.ttl_ms)
            cursor.execute(
                SQLiteSQL.TAKE_OVER, {**params, "ids": id_list, "token": token, "now": now, "offset": offset}
            )
            return (token, taken), True

        outcome = self._run("take a holder over", work)
        if outcome is None:
            return None
        token, taken = outcome
        return Grant(request=request, token=token, taken=tuple(r.node for r in records if r.node.id in taken))

    # --- waiting ---------------------------------------------------------------

    def wait(self, targets: Sequence[tuple[Node, Mode]], timeout: float, attempt: int) -> None:
        """Block until a release that may free one of ``targets`` is announced, a backoff step passes, or ``timeout``.

        On PostgreSQL a release wakes the waiter (``LISTEN/NOTIFY``) if it
        gave back a node of ``targets`` in a mode that conflicts with the one
        asked there: releases of intention holders above a leaf do not wake
        every waiter in the tree. The backoff step, longer then, is only the
        fallback for leases that run out. Without a listener this sleeps the
        ordinary backoff step.
        """
        listener = self._listening(timeout)
        if listener is None:
            super().wait(targets, timeout, attempt)
        else:
            step = backoff_delay(attempt, initial=NOTIFY_FALLBACK_INITIAL, cap=NOTIFY_FALLBACK_CAP)
            self._wait_on(listener, _wake_tokens(targets), min(timeout, step))

    def wait_for_release(self, nodes: Sequence[Node], timeout: float) -> bool:
        """Block until a release touching ``nodes`` is announced; return False after ``timeout``.

        "Announced" counts from this thread's last :meth:`acquire`, so a
        release between that attempt and this wait is not missed; it is also
        True at once when the listener (re)started since, as a release may
        have gone unheard. Sleeps ``timeout`` and returns False when nothing
        can listen (not PostgreSQL, or the listening connection fails).
        """
        listener = self._listening(timeout)
        if listener is None:
            time.sleep(timeout)
            return False
        # X conflicts with every mode: any release of these nodes counts.
        return self._wait_on(listener, _wake_tokens([(node, Mode.X) for node in nodes]), timeout)

    def _wait_on(self, listener: _Listener, tokens: frozenset[str], timeout: float) -> bool:
        seen = getattr(self._local, "notify_seen", None)
        since = seen[1] if seen is not None and seen[0] is listener else None
        return listener.wait(tokens, since, timeout)

    def _listening(self, timeout: float) -> _Listener | None:
        """Return this process's listener once it listens, starting it if needed; None if it cannot."""
        if not self.supports_notify:
            return None
        self._forget_inherited()
        with self._lock:
            listener = self._listener
            if listener is None or listener.ended:
                if listener is not None and time.monotonic() - listener.ended_at < LISTENER_RETRY_DELAY:
                    return None  # it failed just now: do not hammer a database that is down
                listener = self._listener = _Listener(self._listen_connection)
                listener.start()
        return listener if listener.ready(min(timeout, LISTENER_START_TIMEOUT)) else None

    def _listen_connection(self) -> Any:
        wrapper = self._new_wrapper()
        return wrapper.get_new_connection(wrapper.get_connection_params())

    # --- inspection and maintenance ---------------------------------------------

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
        nodes, holders, params = [], [], {}
        if namespace is not None:
            nodes.append("namespace")
            params["namespace"] = namespace
        if path_prefix:
            nodes.append("path_prefix")
            params.update(path_prefix=path_prefix, prefix_length=len(path_prefix))
        if parent is not None:
            nodes.append("parent" if parent else "top_level")
            params["parent"] = parent
        if mode is not None:
            holders.append("mode")
            params["mode"] = Mode(mode).value
        if host is not None:
            holders.append("host")
            params["host"] = host
        if expired is not None:
            holders.append("expired" if expired else "live")
        after = _decode_cursor(cursor) if cursor else None
        rows = self._run(
            "list holders",
            lambda db_cursor: (self._page(db_cursor, nodes, holders, params, after, limit), False),
            transaction=False,
        )
        return HolderPage([_record(row) for row in rows], _next_cursor(rows, limit))

    def node_holders(self, node: Node) -> list[HolderRecord]:
        return self._records("read a lock node", [], ["node_id"], {"node_id": node.id})

    def holder_records(self, holder_id: str) -> list[HolderRecord]:
        return self._records("look a holder up", [], ["holder_id"], {"holder_id": holder_id})

    def expired_with_intent(self, *, namespace: str | None = None, grace: float = 0.0) -> list[HolderRecord]:
        nodes, params = ([], {}) if namespace is None else (["namespace"], {"namespace": namespace})
        params["grace_ms"] = max(0, round(grace * 1000))
        return self._records("find holders awaiting recovery", nodes, ["awaiting_recovery"], params)

    def evict_expired(
        self,
        *,
        namespace: str | None = None,
        grace: float = 0.0,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> list[HolderRecord]:
        grace_ms = max(0, round(grace * 1000))
        nodes, params = ([], {}) if namespace is None else (["namespace"], {"namespace": namespace})
        params["grace_ms"] = grace_ms
        if not dry_run:
            self._run("drop expired waiting markers", self._drop_expired_markers, transaction=False)
        evicted: list[HolderRecord] = []
        after: tuple[str, str, str] | None = None
        while True:
            rows = self._run(
                "find expired holders",
                functools.partial(self._page_work, nodes=nodes, holders=["evictable"], params=params, after=after),
                transaction=False,
            )
            if dry_run:
                evicted.extend(_record(row) for row in rows)
            elif rows:
                evict = functools.partial(self._evict, ids=sorted({row[3] for row in rows}), grace_ms=grace_ms)
                evicted.extend(self._run("evict expired holders", evict))
            if progress is not None:
                progress(len(evicted))
            if _next_cursor(rows, self.page_size) is None:
                return evicted
            after = (rows[-1][0], rows[-1][1], rows[-1][2])

    def _drop_expired_markers(self, cursor: Any) -> tuple[None, bool]:
        """Delete the markers of requests that stopped waiting without withdrawing them (all namespaces)."""
        if self.vendor == "postgresql":
            cursor.execute(PostgresSQL.DROP_EXPIRED_MARKERS, {})
        else:
            cursor.execute(SQLiteSQL.DROP_EXPIRED_MARKERS, {"now": self._sqlite_now(cursor)})
        return None, True

    def _page_work(self, cursor: Any, **kwargs: Any) -> tuple[list[Any], bool]:
        return self._page(cursor, limit=self.page_size, **kwargs), False

    def _page(
        self,
        cursor: Any,
        nodes: list[str],
        holders: list[str],
        params: dict[str, Any],
        after: tuple[str, str, str] | None,
        limit: int,
    ) -> list[Any]:
        """Read the holders matching ``holders`` of the next ``limit`` nodes matching ``nodes``, after ``after``."""
        node_where = [self.sql.NODE_FILTERS[name] for name in nodes]
        params = {**params, "limit": limit}
        if after is not None:
            node_where.append(self.sql.AFTER)
            params["after_namespace"], params["after_kind"], params["after_key"] = after
        cursor.execute(self._with_filters(self.sql.PAGE, node_where, holders), self._with_clock(cursor, params))
        return cursor.fetchall()

    def _records(self, action: str, nodes: list[str], holders: list[str], params: dict[str, Any]) -> list[HolderRecord]:
        query = self._with_filters(self.sql.RECORDS, [self.sql.NODE_FILTERS[name] for name in nodes], holders)

        def work(cursor: Any) -> tuple[list[Any], bool]:
            cursor.execute(query, self._with_clock(cursor, params))
            return cursor.fetchall(), False

        return [_record(row) for row in self._run(action, work, transaction=False)]

    def _with_filters(self, query: str, node_where: list[str], holders: list[str]) -> str:
        holder_where = [self.sql.HOLDER_FILTERS[name] for name in holders]
        return query.replace("{nodes}", " AND ".join(node_where) or "1 = 1").replace(
            "{holders}", " AND ".join(holder_where) or "1 = 1"
        )

    def _with_clock(self, cursor: Any, params: dict[str, Any]) -> dict[str, Any]:
        """SQLite: add the database's now (and the eviction cutoff) to ``params``."""
        if self.vendor != "sqlite":
            return params
        now = self._sqlite_now(cursor)
        return {**params, "now": now, "cutoff": self._sqlite_time(cursor, now, -params.get("grace_ms", 0))}

    def _evict(self, cursor: Any, ids: list[str], grace_ms: int) -> tuple[list[HolderRecord], bool]:
        if self.vendor == "postgresql":
            cursor.execute(PostgresSQL.LOCK_NODES, {"ids": ids})
            cursor.execute(PostgresSQL.EVICT, {"ids": ids, "grace_ms": grace_ms})
            return [_record(row) for row in cursor.fetchall()], True
        id_list = json.dumps(ids)
        now = self._sqlite_now(cursor)
        cutoff = self._sqlite_time(cursor, now, -grace_ms)
        cursor.execute(
            self._with_filters(SQLiteSQL.RECORDS, [], ["on_nodes", "evictable"]), {"ids": id_list, "cutoff": cutoff}
        )
        found = [_record(row) for row in cursor.fetchall()]
        cursor.execute(SQLiteSQL.EVICT_EXPIRED_ON, {"ids": id_list, "cutoff": cutoff})
        cursor.execute(SQLiteSQL.DELETE_EMPTY_NODES, {"ids": id_list})
        return found, True

    @staticmethod
    def _sqlite_time(cursor: Any, now: str, offset_ms: int) -> str:
        cursor.execute(SQLiteSQL.TIME, {"now": now, "offset": _sqlite_offset(offset_ms)})
        return cursor.fetchone()[0]


def _next_cursor(rows: Sequence[Sequence[Any]], limit: int) -> str | None:
    """The cursor after a page of rows, if the page was full (``limit`` nodes)."""
    if len({row[3] for row in rows}) < limit:
        return None
    return _encode_cursor(rows[-1][:3])


@contextlib.contextmanager
def _as_django_connection(wrapper: BaseDatabaseWrapper) -> Iterator[None]:
    """Make ``wrapper`` this thread's ``connections[wrapper.alias]`` for a while.

    Migrations manage transactions through ``connections[alias]``; they must
    run on the lock connection, not on the caller's (which may be inside an
    ``atomic()`` block that could roll the tables back).
    """
    alias = wrapper.alias
    try:
        previous = connections[alias]
    except ConnectionDoesNotExist:
        previous = None
    connections[alias] = wrapper
    try:
        yield
    finally:
        if previous is None:
            del connections[alias]
        else:
            connections[alias] = previous


def _without_ttl(url: str) -> str:
    """Drop the ``ttl`` of a ``LOCK_BACKEND`` URL: it is the lease, not a driver option."""
    base, _, query = url.partition("?")
    kept = [(k, v) for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True) if k != "ttl"]
    return base + ("?" + urllib.parse.urlencode(kept) if kept else "")


def _sqlite_offset(ms: int) -> str:
    return f"{ms / 1000:+.3f} seconds"


def _payload(released: Sequence[tuple[Node, Mode | None]]) -> str:
    """Name what a release gave back: ``tag:mode`` per node (``tag:*`` when the mode is unknown)."""
    payload = ",".join(f"{node_tag(node.id)}:{'*' if mode is None else mode.value}" for node, mode in released)
    return payload if len(payload) <= NOTIFY_PAYLOAD_LIMIT else "*"


def _wake_tokens(targets: Sequence[tuple[Node, Mode]]) -> frozenset[str]:
    """The payload entries that may free one of ``targets``: its node released in a conflicting or unknown mode."""
    tokens = set()
    for node, mode in targets:
        tag = node_tag(node.id)
        tokens.add(f"{tag}:*")
        tokens.update(f"{tag}:{held.value}" for held in modes.conflicting(mode))
    return frozenset(tokens)


def _psycopg3() -> bool:
    """Whether the PostgreSQL driver is psycopg 3.2+, whose ``notifies()`` takes a timeout."""
    try:
        import psycopg
    except ImportError:
        return False
    version = tuple(int(part) for part in psycopg.__version__.split(".")[:2] if part.isdigit())
    return version >= (3, 2)


def _driver_errors(vendor: str) -> tuple[type[BaseException], ...]:
    """The driver's own error classes, for the few calls Django does not wrap."""
    if vendor == "sqlite":
        import sqlite3

        return (sqlite3.Error,)
    try:
        import psycopg

        return (psycopg.Error,)
    except ImportError:  # pragma: no cover - psycopg2
        import psycopg2

        return (psycopg2.Error,)
