"""The database lock backend: locks as rows of SQL tables taken with SELECT ... FOR UPDATE, the JDBC way.

This module is the part every database shares: connections of the backend's
own (one per thread, never the caller's, so lock state commits on its own
and is not rolled back with the caller's work), failure translation, schema
setup, waiting and the listing and reaping loops. What to send and how to
read the answer is the dialect's (``dialect.Dialect``: its declared features
and methods), chosen by the Django wrapper's vendor in :data:`DIALECTS`:
``postgresql/`` (the production target: acquire and release one autocommit
call each, waiters woken by ``LISTEN/NOTIFY``) and ``sqlite/`` (the
zero-setup embedded default, with the limits its module lists). This module
names no vendor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import environ
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.db import Error as DjangoDatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import ConnectionDoesNotExist, ConnectionHandler, load_backend

from ... import observability
from ...exceptions import LockBackendUnavailable
from ...forks import ForkSafeLock
from ...limits import Limits
from ...modes import Mode
from ...records import Grant, HolderPage, HolderRecord, LockRequest, Node, Owner, WaitState
from ...redaction import add_secrets, redact, url_secrets
from ...steps import Steps
from ..base import BaseLockBackend, backoff_delay, close_per_loop, expires_ms, takeover_request
from .dialect import Dialect
from .postgresql import PostgresDialect
from .rows import decode_cursor, encode_cursor, json_text, record, takeover_params, waiter
from .sqlite import SQLiteDialect

logger = logging.getLogger("django_esdlock")

T = TypeVar("T")

APP_LABEL = "django_esdlock"
URL_ALIAS = "django_esdlock"
"""The alias the lock connection of a ``url`` configuration goes by (logs, routers, migrations)."""

NOTIFY_QUEUED_POLL_CAP = 0.5
"""Longest sleep of a queued waiter that listens (see ``BaseLockBackend.queued_poll_cap``)."""

ASYNC_SESSIONS = 10
"""Default of OPTIONS ``async_sessions``: PostgreSQL sessions per event loop for the async API's calls."""

NOTIFY_FALLBACK_INITIAL = 0.25
NOTIFY_FALLBACK_CAP = 2.0
"""Longest wait between attempts while listening: a lease that runs out sends no notification."""

DIALECTS: dict[str, type[Dialect]] = {dialect.vendor: dialect for dialect in (PostgresDialect, SQLiteDialect)}
"""The dialect of each Django database vendor the backend supports (``DatabaseWrapper.vendor``)."""

URL_SCHEMES = frozenset().union(*(dialect.url_schemes for dialect in DIALECTS.values()))
"""The ``LOCK_BACKEND`` URL schemes of every dialect (django-environ's names of its databases)."""

_LOCK_SETTINGS = ("ttl", "deadlock_timeout", "token_floor", *(key.lower() for key in Limits.SETTINGS))
"""The query parameters of a ``LOCK_BACKEND`` URL that are lock settings, not the database's."""

# What a forked child inherited: never used, never closed (closing would end
# the parent's sessions), kept from the garbage collector for the same reason.
_inherited: list[Any] = []


class _ThreadConnection:
    """The lock connection of one thread, closed when the thread ends and drops its locals."""

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self.wrapper = wrapper
        self.pid = os.getpid()

    def __del__(self) -> None:
        if self.pid == os.getpid():  # a forked child must not end its parent's session
            _close_when_idle(self.wrapper)


def _close_when_idle(wrapper: BaseDatabaseWrapper) -> None:
    """Close ``wrapper`` now if no call runs on it, else make the thread running one close it after.

    ``close()`` and the garbage collector come from other threads than the
    connection's: closing a connection under a running statement crashes
    SQLite (a segmentation fault) and breaks psycopg's protocol state.
    """
    in_use: threading.RLock = wrapper._esdlock_in_use  # type: ignore[attr-defined]
    wrapper._esdlock_close = True  # type: ignore[attr-defined]
    if in_use.acquire(blocking=False):  # else the thread using it sees the flag when its call ends
        try:
            with contextlib.suppress(Exception):
                wrapper.close()
        finally:
            in_use.release()


@contextlib.contextmanager
def _in_use(wrapper: BaseDatabaseWrapper) -> Iterator[None]:
    """Mark ``wrapper`` busy for a call; if it was closed meanwhile from elsewhere, close it after the call."""
    in_use: threading.RLock = wrapper._esdlock_in_use  # type: ignore[attr-defined]
    with in_use:
        yield
    if getattr(wrapper, "_esdlock_close", False):
        _close_when_idle(wrapper)


class DatabaseLockBackend(BaseLockBackend):
    """Locks in the tables of a SQL database (``esdlock_*``, made by ``migrate`` or on first use).

    OPTIONS: exactly one of ``using`` (a ``DATABASES`` alias) or ``url`` (a
    ``postgres://`` or ``sqlite:///`` URL, as django-environ reads it);
    ``token_floor``: every fencing token exceeds it (after a restore that
    rewound the token counter: see "Restoring a lock store" in docs/howto/operating.md).
    PostgreSQL and SQLite are supported. Lock state lives on connections of
    the backend's own, one per thread, in autocommit (with short explicit
    transactions where the dialect needs them): never on the caller's
    connection or in its transaction.
    """

    def __init__(
        self,
        *,
        ttl: float = 30.0,
        using: str | None = None,
        url: str | None = None,
        async_sessions: int = ASYNC_SESSIONS,
        token_floor: int | str = 0,
        **options: Any,
    ) -> None:
        super().__init__(ttl=ttl)
        if options:
            raise ImproperlyConfigured(
                f"DatabaseLockBackend got unknown OPTIONS {', '.join(sorted(options))}; "
                "use 'using' or 'url' (and 'async_sessions', 'token_floor')"
            )
        if isinstance(async_sessions, bool) or not isinstance(async_sessions, int) or async_sessions < 1:
            raise ImproperlyConfigured(
                f"DatabaseLockBackend OPTIONS['async_sessions'] must be a positive integer, not {async_sessions!r}"
            )
        self.async_sessions = async_sessions
        if isinstance(token_floor, str) and token_floor.strip().isdigit():
            token_floor = int(token_floor)
        if type(token_floor) is not int or not 0 <= token_floor < 2**62:
            raise ImproperlyConfigured(
                f"DatabaseLockBackend OPTIONS['token_floor'] must be an int from 0 to 2**62, not {token_floor!r}"
            )
        self.token_floor = token_floor
        self._floor_raised = not token_floor
        if (using is None) == (url is None):
            raise ImproperlyConfigured("DatabaseLockBackend needs exactly one of OPTIONS 'using' (an alias) or 'url'")
        self.using = using
        self.url = url
        self._url_settings: dict[str, Any] | None = None
        if url is not None:
            try:
                config = environ.Env.db_url_config(_without_ttl(url))
            except Exception as e:
                raise ImproperlyConfigured(
                    redact(f"DatabaseLockBackend OPTIONS['url'] is not a database URL: {e}")
                ) from e
            # A private handler fills in Django's defaults, as for DATABASES.
            self._url_settings = ConnectionHandler({DEFAULT_DB_ALIAS: {}, URL_ALIAS: config}).settings[URL_ALIAS]
        elif using not in connections.settings:
            raise ImproperlyConfigured(f"DatabaseLockBackend OPTIONS['using'] names no database: {using!r}")
        settings_dict = self._base_settings()
        add_secrets(*url_secrets(url or ""), settings_dict.get("PASSWORD"))
        try:
            wrapper_class = load_backend(settings_dict["ENGINE"]).DatabaseWrapper
        except (ImproperlyConfigured, ImportError) as e:  # some Django versions let a driver's ImportError out
            raise ImproperlyConfigured(
                f"DatabaseLockBackend cannot load database engine {settings_dict['ENGINE']!r}: {e}"
            ) from e
        self.vendor: str = wrapper_class.vendor
        dialect_class = DIALECTS.get(self.vendor)
        if dialect_class is None:
            supported = " and ".join(d.display_name for d in DIALECTS.values())
            raise ImproperlyConfigured(
                f"DatabaseLockBackend supports {supported}, not {wrapper_class.display_name} "
                f"({settings_dict['ENGINE']})"
            )
        if dialect_class.needs_database_file and str(settings_dict["NAME"]) in ("", ":memory:"):
            raise ImproperlyConfigured(
                f"DatabaseLockBackend needs a {dialect_class.display_name} database file, not an in-memory database"
            )
        self.dialect: Dialect = dialect_class()
        # PostgreSQL through psycopg 3.2+: notified waiters, and the async API's own sessions per event loop.
        self.features = self.dialect.store_features()
        if self.features.notifies:  # a release wakes waiters; polling only catches leases that ran out
            self.queued_poll_cap = NOTIFY_QUEUED_POLL_CAP
        self._local = threading.local()
        self._lock = ForkSafeLock()
        # Weak: a thread's connection goes with the thread (see _ThreadConnection).
        self._wrappers: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()
        self._pid = os.getpid()
        self._schema_ready = False
        # The dialect's sessions of each event loop (see Dialect.loop_sessions).
        self._loop_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    def describe(self) -> str:
        where = self.dialect.describe(self._base_settings())
        return redact(where if self.using is None else f"{where} (alias {self.using!r})")

    # --- declarations (see BaseLockBackend) -------------------------------------

    url_schemes = URL_SCHEMES

    @classmethod
    def options_from_url(cls, url: str) -> dict[str, Any]:
        """``postgres://user:pass@host:5432/db?sslmode=require`` or ``sqlite:////abs/path.sqlite3``: OPTIONS ``url``.

        Every query parameter but the lock settings' (``ttl``, ``token_floor``,
        ...) stays in ``url``, for the database; ``token_floor`` becomes the
        option of that name.
        """
        # Cut the query by hand: urlunsplit would turn sqlite:////abs/path into sqlite://abs/path.
        base, _, query = url.partition("?")
        pairs = urllib.parse.parse_qsl(query)
        rest = urllib.parse.urlencode([(k, v) for k, v in pairs if k not in _LOCK_SETTINGS])
        options: dict[str, Any] = {"url": f"{base}?{rest}" if rest else base}
        token_floor = dict(pairs).get("token_floor")
        if token_floor is not None:
            options["token_floor"] = token_floor
        return options

    def endpoints(self) -> tuple[list[tuple[str, int]], str]:
        """The database server's (host, port), as the dialect reads the settings; none for a local file."""
        return self.dialect.endpoints(self._base_settings())

    def options_through(self, options: dict[str, Any], ports: Sequence[int]) -> dict[str, Any]:
        """``options`` with the database reached at 127.0.0.1:``ports`` by URL (an alias becomes its URL).

        One port per server of :meth:`endpoints`, in their order (a multi-host URL stays one).
        """
        options = dict(options)
        if "url" in options:
            parts = urllib.parse.urlsplit(options["url"])
            auth = parts.netloc.rpartition("@")[0]
            servers = ",".join(f"127.0.0.1:{port}" for port in ports)
            netloc = f"{auth + '@' if auth else ''}{servers}"
            options["url"] = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
        else:  # a DATABASES alias: the same database, by URL
            options["url"] = self.dialect.url_through(connections.settings[options.pop("using")], "127.0.0.1", ports)
        return options

    # --- connections -----------------------------------------------------------

    def _base_settings(self) -> dict[str, Any]:
        if self._url_settings is not None:
            return self._url_settings
        # Read at each new connection: test runners rename databases at run time.
        return connections.settings[self.using]

    def _new_wrapper(self) -> BaseDatabaseWrapper:
        base = self._base_settings()
        options = {k: v for k, v in base["OPTIONS"].items() if k != "pool"}  # one long-lived connection per thread
        options = self.dialect.connection_options(options, self.ttl)
        settings_dict = {**base, "OPTIONS": options, "AUTOCOMMIT": True, "ATOMIC_REQUESTS": False}
        wrapper = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(settings_dict, self.using or URL_ALIAS)
        wrapper.inc_thread_sharing()  # close() may come from another thread
        wrapper._esdlock_in_use = threading.RLock()  # type: ignore[attr-defined]  # see _close_when_idle
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
                self._loop_sessions = weakref.WeakKeyDictionary()
                self._pid = os.getpid()

    def close(self) -> None:
        with self._lock:
            wrappers, self._wrappers = list(self._wrappers), weakref.WeakSet()
            self._local = threading.local()
            ours = self._pid == os.getpid()
        if ours:
            for wrapper in wrappers:
                _close_when_idle(wrapper)
            loop_sessions, self._loop_sessions = self._loop_sessions, weakref.WeakKeyDictionary()
            close_per_loop(loop_sessions, lambda sessions: sessions.aclose())

    def _prepare(self, wrapper: BaseDatabaseWrapper) -> None:
        """Open the connection if needed and set up a new one for lock work."""
        if wrapper.connection is not None and getattr(wrapper, "_esdlock_prepared", None) is wrapper.connection:
            return
        wrapper.ensure_connection()
        with wrapper.cursor() as cursor:
            self.dialect.prepare(wrapper, cursor)
        wrapper._esdlock_prepared = wrapper.connection  # type: ignore[attr-defined]
        wrapper._esdlock_call_timeout = None  # type: ignore[attr-defined]  # see _bound

    def _discard(self, wrapper: BaseDatabaseWrapper) -> None:
        """Close a connection left in an unknown state; the next use opens a new one."""
        with contextlib.suppress(Exception):
            wrapper.close()
        wrapper.connection = None

    def _is_missing_schema(self, error: BaseException) -> bool:
        cause: BaseException | None = error
        while cause is not None:  # ours, then Django's, then the driver's
            if self.dialect.is_missing_schema(cause):
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
        except (DjangoDatabaseError, *self.dialect.driver_errors()) as e:
            raise LockBackendUnavailable(f"{self.describe()} failed to {action}: {e}") from e

    def _run(
        self,
        action: str,
        work: Callable[[Any], tuple[T, bool]],
        *,
        transaction: bool = True,
        timeout: float | None = None,
    ) -> T:
        """Run ``work(cursor)`` on this thread's lock connection; commit if it returns ``(value, True)``.

        With ``transaction`` the work runs between BEGIN and COMMIT/ROLLBACK;
        any failure rolls back (the server does, if the connection died).
        Without, each statement is its own transaction (autocommit). With
        ``timeout``, each statement may take that many seconds (see
        :meth:`_bound`). If the lock tables do not exist yet they are created
        and the work is run once more.
        """
        if timeout is not None and timeout <= 0:
            raise LockBackendUnavailable(f"{self.describe()} had no time left to {action}: its lease runs out")
        wrapper = self.connection
        for first_try in (True, False):
            try:
                with observability.store_request(self, action), self._translate(action), _in_use(wrapper):
                    return self._run_once(wrapper, work, transaction, timeout)
            except LockBackendUnavailable as e:
                if first_try and not self._schema_ready and self._is_missing_schema(e):
                    logger.info("creating the lock tables in %s", self.describe())
                    self.setup()
                    continue
                raise
        raise AssertionError("unreachable")

    @staticmethod
    def _cursor(wrapper: BaseDatabaseWrapper) -> contextlib.AbstractContextManager[Any]:
        """The driver's cursor, unless queries of this connection are being captured or wrapped.

        With DEBUG on, Django's cursor spells out every statement for its
        query log, which costs a lock call about as much as the call itself;
        lock work on the backend's own connection belongs in nobody's log,
        unless asked for: ``CaptureQueriesContext`` forces the debug cursor,
        ``execute_wrapper()`` (lock_bench counts round trips so) wraps it.
        """
        if wrapper.force_debug_cursor or wrapper.execute_wrappers:
            return wrapper.cursor()
        return contextlib.closing(wrapper.create_cursor())

    def _run_once(
        self,
        wrapper: BaseDatabaseWrapper,
        work: Callable[[Any], tuple[T, bool]],
        transaction: bool,
        timeout: float | None,
    ) -> T:
        try:
            self._prepare(wrapper)
            with self._cursor(wrapper) as cursor:
                self._bound(wrapper, cursor, timeout)
                if not transaction:
                    return work(cursor)[0]
                cursor.execute(self.dialect.BEGIN, [])
                try:
                    value, commit = work(cursor)
                except BaseException:
                    with contextlib.suppress(Exception):  # the first error is the one to report
                        cursor.execute(self.dialect.ROLLBACK, [])
                    raise
                cursor.execute(self.dialect.COMMIT if commit else self.dialect.ROLLBACK, [])
                return value
        except BaseException:
            # Whether the rollback failed, the connection broke or the thread
            # was interrupted mid-transaction: never reuse this connection.
            self._discard(wrapper)
            raise

    def _bound(self, wrapper: BaseDatabaseWrapper, cursor: Any, timeout: float | None) -> None:
        """Bound the statements of this call to ``timeout`` seconds, or lift a bound an earlier call left.

        The bound is a session setting (``statement_timeout``, SQLite's busy
        timeout), kept between calls: a renewer's session, whose every call is
        bounded by about the same lease, sets it once, not before each call.
        It is set again when the bound asked is below it or more than twice it.
        """
        wanted = None if timeout is None else max(1, math.floor(timeout * 1000))
        current = getattr(wrapper, "_esdlock_call_timeout", None)
        if wanted == current or (wanted is not None and current is not None and current <= wanted <= 2 * current):
            return
        self.dialect.call_timeout(wrapper, cursor, wanted)
        wrapper._esdlock_call_timeout = wanted  # type: ignore[attr-defined]

    # --- schema ---------------------------------------------------------------

    def setup(self) -> None:
        """Apply django_esdlock's migrations to the lock database unless they are applied."""
        from django.db.migrations.executor import MigrationExecutor

        wrapper = self.connection
        with self._translate("create the lock tables"), _in_use(wrapper), _as_django_connection(wrapper):
            self._prepare(wrapper)
            with self.dialect.setup_guard(wrapper, self._base_settings()):
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
                        # Another process may have created them meanwhile: look again.
                        if last_try or not self.dialect.setup_may_race:
                            raise
        self._schema_ready = True

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Report an unreachable lock database, and standbys a failover to which loses acknowledged grants.

        This connects: ``manage.py check --deploy`` asks for it.
        """

        def reach(cursor: Any) -> tuple[str | None, bool]:
            cursor.execute(self.dialect.CHECK, [])
            return self.dialect.failover_risk(cursor), False

        try:
            risk = self._run("reach the database", reach, transaction=False)
        except LockBackendUnavailable as e:
            return [
                checks.Error(
                    str(e),
                    hint="Start the database or fix LOCK_BACKEND['OPTIONS'].",
                    id="django_esdlock.E002",
                )
            ]
        if risk:
            return [
                checks.Warning(
                    f"{self.describe()}: a failover may lose granted locks: {risk}.",
                    hint="Replicate the lock database synchronously (synchronous_standby_names names its standbys, "
                    "synchronous_commit on) and fail over only to a synchronous standby: see "
                    "'Failover to a standby' in the database topic of the docs.",
                    id="django_esdlock.W012",
                )
            ]
        return []

    # --- the primitive ------------------------------------------------------

    def _raise_token_floor(self) -> None:
        """Before this backend's first grant: make the token counter give only tokens above OPTIONS ``token_floor``.

        After a restore that rewound the counter (see "Restoring a lock store"
        in docs/howto/operating.md). Once per backend: the counter only grows from then.
        """
        if self._floor_raised:
            return
        self._floor_raised = True  # first: the _run below must not come back here
        work = functools.partial(self.dialect.raise_token_floor, floor=self.token_floor)
        try:
            raised = self._run("raise the token floor", work, transaction=not self.dialect.atomic_calls)
        except BaseException:
            self._floor_raised = False
            raise
        if raised:
            logger.warning(
                "raised the fencing token counter of %s to OPTIONS token_floor %d", self.describe(), self.token_floor
            )

    def acquire(self, request: LockRequest) -> Grant | None:
        self._raise_token_floor()
        nodes = sorted(dict(request.targets), key=lambda node: node.id)
        work = functools.partial(self.dialect.acquire, request=request, nodes=nodes, marker_ttl_ms=self.marker_ttl_ms)
        try:
            return self._run("acquire", work, transaction=not self.dialect.atomic_calls)
        except BaseException:
            if self.dialect.atomic_calls:
                # The call may have committed a grant whose answer never
                # arrived: give it back, best-effort (its lease ends it else).
                with contextlib.suppress(Exception):
                    self._release(request.holder_id, request.owner.key, [(node, None) for node in nodes])
            raise

    def release(self, grant: Grant) -> bool:
        asked = dict(grant.request.targets)
        released = [(node, asked[node]) for node in grant.taken]
        return self._release(grant.request.holder_id, grant.request.owner.key, released)

    def force_release(self, holder_id: str, nodes: Sequence[Node]) -> bool:
        return self._release(holder_id, None, [(node, None) for node in nodes])

    def _release(self, holder_id: str, owner_key: str | None, released: Sequence[tuple[Node, Mode | None]]) -> bool:
        """Remove ``holder_id`` (of ``owner_key``, or anyone's) from the nodes; True if it was on all."""
        if not released:
            return True
        work = functools.partial(self.dialect.release, holder_id=holder_id, owner_key=owner_key, released=released)
        return self._run("release", work, transaction=not self.dialect.atomic_calls)

    def withdraw(self, request: LockRequest) -> None:
        self._run(
            "withdraw waiting markers",
            functools.partial(self.dialect.withdraw, request=request),
            transaction=not self.dialect.atomic_calls,
        )

    def renew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> bool:
        if not grant.taken:
            return True
        work = functools.partial(
            self.dialect.renew, grant=grant, checkpoint=json_text(checkpoint), recovery=json_text(recovery)
        )
        return self._run("renew", work, transaction=not self.dialect.atomic_calls, timeout=timeout)

    def renew_many(self, grants: Sequence[Grant], *, timeout: float | None = None) -> list[bool | None]:
        held = [grant for grant in grants if grant.taken]
        if not held:
            return [True] * len(grants)
        work = functools.partial(self.dialect.renew_many, grants=held)
        renewed = iter(self._run("renew", work, transaction=not self.dialect.atomic_calls, timeout=timeout))
        return [next(renewed) if grant.taken else True for grant in grants]

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
        self._raise_token_floor()
        records, arbiter, request = takeover_request(
            records, owner, ttl, require_expired=require_expired, require_live=require_live
        )
        ids = [r.node.id for r in records]
        params = takeover_params(arbiter, owner, json_text(recovery), request.ttl_ms, require_expired, require_live)
        params["expected_expires_ms"] = expires_ms(arbiter) if require_unchanged else None
        outcome = self._run(
            "take a holder over",
            functools.partial(self.dialect.take_over, ids=ids, params=params),
            transaction=not self.dialect.atomic_calls,
        )
        if outcome is None:
            return None
        token, taken = outcome
        return Grant(request=request, token=token, taken=tuple(r.node for r in records if r.node.id in taken))

    # --- waiting ---------------------------------------------------------------

    def wait_release(self, request: LockRequest, timeout: float, attempt: int) -> None:
        """Block until a release that may free this thread's request is announced, a backoff step, or ``timeout``.

        Where the dialect notifies (PostgreSQL: ``postgresql/listener.py``)
        this thread's own lock session listens: a release notifies the sessions of the waiters it may
        free, and the thread reads its socket. The first wait of a session
        only starts listening and returns at once (the caller tries again).
        The backoff step, longer with a listener, is the fallback for leases
        and markers that run out. Elsewhere this sleeps the backoff step.
        """
        if not self.features.notifies:
            super().wait_release(request, timeout, attempt)
            return
        wrapper = self.connection
        try:
            with self._translate("wait for a release"):
                if not self.dialect.listening(wrapper):
                    self._run(
                        "listen for releases",
                        lambda cursor: (self.dialect.listen(wrapper, cursor), False),
                        transaction=False,
                    )
                    return
                step = backoff_delay(attempt, initial=NOTIFY_FALLBACK_INITIAL, cap=NOTIFY_FALLBACK_CAP)
                with _in_use(wrapper):
                    self.dialect.wait_for_release(wrapper, min(timeout, step))
        except LockBackendUnavailable as e:
            logger.info("waiting without notifications: %s", e)
            self._discard(wrapper)
            super().wait_release(request, timeout, attempt)

    # --- the async API: natively where the dialect is async-native, else the blocking calls in a worker thread ---

    def _sessions(self) -> Any:
        """The running event loop's sessions (made on first use)."""
        self._forget_inherited()
        loop = asyncio.get_running_loop()
        sessions = self._loop_sessions.get(loop)
        if sessions is None:
            sessions = self._loop_sessions[loop] = self.dialect.loop_sessions(self._new_wrapper(), self.async_sessions)
        return sessions

    async def _acall(self, action: str, steps: Callable[[], Steps[T]]) -> T:
        """Drive the steps ``steps()`` makes on a session of this loop; translate failures as :meth:`_run` does."""
        for first_try in (True, False):
            try:
                with observability.store_request(self, action):
                    return await self._sessions().run(steps())
            except self.dialect.driver_errors() as e:
                if first_try and not self._schema_ready and self.dialect.is_missing_schema(e):
                    logger.info("creating the lock tables in %s", self.describe())
                    await asyncio.to_thread(self.setup)
                    continue
                raise LockBackendUnavailable(f"{self.describe()} failed to {action}: {e}") from e
            except OSError as e:
                raise LockBackendUnavailable(f"{self.describe()} failed to {action}: {e}") from e
        raise AssertionError("unreachable")

    async def aacquire(self, request: LockRequest) -> Grant | None:
        if not self.features.async_native:
            return await super().aacquire(request)
        if not self._floor_raised:
            await asyncio.to_thread(self._raise_token_floor)
        nodes = sorted(dict(request.targets), key=lambda node: node.id)
        sessions = self._sessions()
        if request.ticket is not None:  # a request that may wait: a release may wake it from now on
            sessions.attempt_begins(request.holder_id)
        try:
            grant = await self._acall("acquire", lambda: self.dialect.acquire_steps(request, nodes, self.marker_ttl_ms))
        except BaseException:
            # The call may have committed a grant whose answer never arrived:
            # give it back, best-effort (its lease ends it else).
            released = [(node, None) for node in nodes]
            with contextlib.suppress(Exception):
                await self._acall(
                    "release",
                    lambda: self.dialect.release_steps(request.holder_id, request.owner.key, released),
                )
            sessions.done_waiting(request.holder_id)
            raise
        if grant is not None:
            sessions.done_waiting(request.holder_id)
        return grant

    async def arelease(self, grant: Grant) -> bool:
        if not self.features.async_native:
            return await super().arelease(grant)
        if not grant.taken:
            return True
        asked = dict(grant.request.targets)
        released = [(node, asked[node]) for node in grant.taken]
        holder_id, owner_key = grant.request.holder_id, grant.request.owner.key
        return await self._acall("release", lambda: self.dialect.release_steps(holder_id, owner_key, released))

    async def arenew(
        self,
        grant: Grant,
        *,
        checkpoint: dict[str, Any] | None = None,
        recovery: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> bool:
        if not self.features.async_native:
            return await super().arenew(grant, checkpoint=checkpoint, recovery=recovery, timeout=timeout)
        if not grant.taken:
            return True
        checkpoint_text, recovery_text = json_text(checkpoint), json_text(recovery)
        renew = self._acall("renew", lambda: self.dialect.renew_steps(grant, checkpoint_text, recovery_text))
        try:
            # A session whose call is cancelled is closed, not reused (see LoopSessions.session).
            return await asyncio.wait_for(renew, timeout)
        except TimeoutError as e:
            raise LockBackendUnavailable(f"{self.describe()} failed to renew within {timeout:.3f}s") from e

    async def awithdraw(self, request: LockRequest) -> None:
        if not self.features.async_native:
            return await super().awithdraw(request)
        self._sessions().done_waiting(request.holder_id)
        await self._acall("withdraw waiting markers", lambda: self.dialect.withdraw_steps(request))

    async def await_release(self, request: LockRequest, timeout: float, attempt: int) -> None:
        """Async :meth:`wait_release`: where async-native, the loop's listening session wakes the task."""
        if self.features.async_native:
            step = backoff_delay(attempt, initial=NOTIFY_FALLBACK_INITIAL, cap=NOTIFY_FALLBACK_CAP)
            if await self._sessions().wait(request.holder_id, min(timeout, step)):
                return
        await super().await_release(request, timeout, attempt)

    async def aclose(self) -> None:
        sessions = self._loop_sessions.pop(asyncio.get_running_loop(), None)
        if sessions is not None:
            await sessions.aclose()

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
        after = decode_cursor(cursor) if cursor else None
        rows = self._run(
            "list holders",
            lambda db_cursor: (self._page(db_cursor, nodes, holders, params, after, limit), False),
            transaction=False,
        )
        return HolderPage([record(row) for row in rows], _next_cursor(rows, limit))

    def node_holders(self, node: Node) -> list[HolderRecord]:
        return self._records("read a lock node", ["node"], ["node_id"], {"node_id": node.id})

    def wait_state(self, nodes: Sequence[Node] | None = None) -> WaitState:
        ids = None if nodes is None else sorted({node.id for node in nodes})
        markers, holders = self._run(
            "read the waiting requests", lambda cursor: self.dialect.wait_state(cursor, ids), transaction=False
        )
        waiters = tuple(w for w in map(waiter, markers) if w is not None)
        return WaitState(waiters, tuple(record(row) for row in holders))

    @property
    def lock_delay(self) -> float:  # type: ignore[override]
        return self.dialect.lock_delay_ms / 1000

    @lock_delay.setter
    def lock_delay(self, seconds: float) -> None:
        self.dialect.lock_delay_ms = round(seconds * 1000)

    def holder_records(self, holder_id: str) -> list[HolderRecord]:
        return self._records("look a holder up", ["holder"], ["holder_id"], {"holder_id": holder_id})

    def expired_with_intent(self, *, namespace: str | None = None, grace: float = 0.0) -> list[HolderRecord]:
        nodes, params = ([], {}) if namespace is None else (["namespace"], {"namespace": namespace})
        params["grace_ms"] = max(0, round(grace * 1000))
        return self._records(
            "find holders awaiting recovery", [*nodes, "awaiting_recovery"], ["awaiting_recovery"], params
        )

    def evict_expired(
        self,
        *,
        namespace: str | None = None,
        grace: float = 0.0,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> list[HolderRecord]:
        grace_ms = max(0, round(grace * 1000))
        nodes, params = (
            (["evictable"], {}) if namespace is None else (["namespace", "evictable"], {"namespace": namespace})
        )
        params["grace_ms"] = grace_ms
        if not dry_run:
            self._run("drop expired waiting markers", self.dialect.drop_expired_markers, transaction=False)
        evicted: list[HolderRecord] = []
        if self.dialect.evicts_by_grant:
            self._evict_by_grant(namespace, grace_ms, dry_run, progress, evicted)
        else:
            after: tuple[str, str, str] | None = None
            while True:  # page by page
                rows = self._run(
                    "find expired holders",
                    functools.partial(self._page_work, nodes=nodes, holders=["evictable"], params=params, after=after),
                    transaction=False,
                )
                if dry_run:
                    evicted.extend(record(row) for row in rows)
                elif rows:
                    evict = functools.partial(self.dialect.evict, rows=rows, grace_ms=grace_ms)
                    evicted.extend(self._run("evict expired holders", evict))
                if progress is not None:
                    progress(len(evicted))
                if _next_cursor(rows, self.page_size) is None:
                    break
                after = (rows[-1][0], rows[-1][1], rows[-1][2])
        if not dry_run:
            self.drop_idle_nodes()
        return evicted

    def _evict_by_grant(
        self,
        namespace: str | None,
        grace_ms: int,
        dry_run: bool,
        progress: Callable[[int], None] | None,
        evicted: list[HolderRecord],
    ) -> None:
        """Evict page by page of :attr:`page_size` grants (whole holders), in holder id order."""
        after = ""
        while True:
            find = functools.partial(
                self.dialect.find_evictable, namespace=namespace, grace_ms=grace_ms, after=after, limit=self.page_size
            )
            rows, holder_ids = self._run("find expired holders", find, transaction=False)
            if dry_run:
                evicted.extend(record(row) for row in rows)
            elif rows:
                evicted.extend(
                    self._run(
                        "evict expired holders", functools.partial(self.dialect.evict, rows=rows, grace_ms=grace_ms)
                    )
                )
            if progress is not None:
                progress(len(evicted))
            if len(holder_ids) < self.page_size:
                return
            after = holder_ids[-1]

    def drop_idle_nodes(self) -> int:
        """Delete node rows no grant holds (PostgreSQL keeps them between holds); return how many were looked at."""
        after, seen = "", 0
        while True:
            work = functools.partial(self.dialect.drop_idle_nodes, after=after, limit=self.page_size)
            count, after = self._run("drop idle lock nodes", work)
            seen += count
            if count < self.page_size:
                return seen

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
        node_where = [self.dialect.NODE_FILTERS[name] for name in nodes]
        params = {**params, "limit": limit}
        if after is not None:
            node_where.append(self.dialect.AFTER)
            params["after_namespace"], params["after_kind"], params["after_key"] = after
        cursor.execute(
            self._with_filters(self.dialect.PAGE, node_where, holders), self.dialect.with_clock(cursor, params)
        )
        return cursor.fetchall()

    def _records(self, action: str, nodes: list[str], holders: list[str], params: dict[str, Any]) -> list[HolderRecord]:
        query = self._with_filters(self.dialect.RECORDS, [self.dialect.NODE_FILTERS[name] for name in nodes], holders)

        def work(cursor: Any) -> tuple[list[Any], bool]:
            cursor.execute(query, self.dialect.with_clock(cursor, params))
            return cursor.fetchall(), False

        return [record(row) for row in self._run(action, work, transaction=False)]

    def _with_filters(self, query: str, node_where: list[str], holders: list[str]) -> str:
        holder_where = [self.dialect.HOLDER_FILTERS[name] for name in holders]
        return query.replace("{nodes}", " AND ".join(node_where) or "1 = 1").replace(
            "{holders}", " AND ".join(holder_where) or "1 = 1"
        )


def _next_cursor(rows: Sequence[Sequence[Any]], limit: int) -> str | None:
    """The cursor after a page of rows, if the page was full (``limit`` nodes)."""
    if len({row[3] for row in rows}) < limit:
        return None
    return encode_cursor(rows[-1][:3])


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
