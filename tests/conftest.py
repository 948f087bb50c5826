"""Fixtures shared by every test module: the real stores."""

from __future__ import annotations

import collections
import contextlib
import copy
import fcntl
import json
import os
from collections.abc import Callable

import pytest

from django_esdlock.conf import load_backend
from django_esdlock.exceptions import LockBackendUnavailable

from . import browser, netns_cluster, throwaway_postgres
from .contract import store_params
from .dbstores import database_url, fresh_database, postgres_store, shared_db_store, sqlite_store
from .peer import Peer
from .stores import elasticsearch_url, es_store, shared_es_store

if os.environ.get("ESDLOCK_ES") == "noida":  # the local override: noida-db even where an Elasticsearch is configured
    os.environ.pop("ELASTICSEARCH_URL", None)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    """Mark the tests of ``test_*_browser.py`` modules ``browser`` (they drive Chromium), the benchmark's ``bench``,
    and those of the Elasticsearch backend's own modules (``test_elasticsearch*.py``) ``elasticsearch``."""
    for item in items:
        if item.module.__name__.endswith("_browser"):
            item.add_marker(pytest.mark.browser)
        elif item.module.__name__.endswith(".test_bench"):
            item.add_marker(pytest.mark.bench)
        if item.module.__name__.startswith("tests.test_elasticsearch"):
            item.add_marker(pytest.mark.elasticsearch)


def pytest_collection_finish(session):
    """Refuse to start, in one line, when a selected test needs a Chromium that is not there."""
    if not browser.chromium_present() and any(item.get_closest_marker("browser") for item in session.items):
        raise pytest.UsageError(f"{browser.MISSING}; or deselect the browser tests with -m 'not browser'")


def _on_noida() -> bool:
    return not os.environ.get("ELASTICSEARCH_URL")


CI_SKIPS_ALLOWED = (
    # A store's identity: the bare-machine path's noida-db has no circuit breaker, no nested-objects limit.
    ("noida-db", _on_noida),
    # The three-node cluster: ./runtests starts it beside the genuine node, never beside noida-db.
    ("no ELASTICSEARCH_HOSTS", _on_noida),
    # The partition tests' namespaced cluster: a machine without ../shared has no genuine Elasticsearch to run.
    ("no ../shared/elasticsearch", lambda: not netns_cluster.TARBALL.exists()),
)
"""(text in the skip reason, when it is allowed) for the only skips a ``CI=true`` run accepts."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``CI=true``, a skip is a failure unless its reason is a store's identity (:data:`CI_SKIPS_ALLOWED`).

    CI means to run every test it selects: a probe's luck, a missing extra
    or a tool that went away must not turn a test into a quiet "s".
    """
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and os.environ.get("CI", "").lower() in ("true", "1"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not any(text in reason and allowed() for text, allowed in CI_SKIPS_ALLOWED):
            report.outcome = "failed"
            report.longrepr = f"skipped under CI=true, which must run it: {reason}"
    return report


def pytest_report_header():
    url = throwaway_postgres.test_database_url()
    source = "a throwaway server of this run" if throwaway_postgres.started() else "DATABASE_URL or 127.0.0.1:5432"
    return [f"postgres: {url} ({source})", f"elasticsearch: {os.environ.get('ELASTICSEARCH_URL') or 'noida-db'}"]


def pytest_unconfigure():
    throwaway_postgres.stop()


@pytest.fixture(scope="session", autouse=True)
def _postgres_alias_of_this_run(django_db_blocker):
    """Point the ``postgres`` alias at a database of this run alone, dropped after it.

    The server's ``test`` database outlives runs and is shared by every
    checkout on the machine: lock tables and functions another checkout's
    migrations left there must not decide this run.
    """
    from django.db import connections

    with django_db_blocker.unblock(), fresh_database(database_url(), prefix="esdlock_alias") as url:
        name = url.rsplit("/", 1)[1]
        connections["postgres"].close()
        connections.settings["postgres"]["NAME"] = connections["postgres"].settings_dict["NAME"] = name
        try:
            yield
        finally:
            connections["postgres"].close()


@pytest.fixture(scope="session")
def _test_processes_lock(tmp_path_factory):
    """Under pytest-xdist: a file every test process opens, shared by tests and held alone by ``alone`` tests."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield None
        return
    # The parent of a worker's base temp is the run's own folder, the same for every worker of the run.
    with open(tmp_path_factory.getbasetemp().parent / "test-processes.lock", "a") as file:
        yield file


@pytest.fixture(autouse=True)
def _alone_or_shared(request, _test_processes_lock):
    """A test marked ``alone`` (a circuit breaker tripped for the whole node, cluster nodes killed) waits until
    the tests of the other test processes end, and holds theirs back until it ends; the others share."""
    if _test_processes_lock is None:
        yield
        return
    fcntl.flock(_test_processes_lock, fcntl.LOCK_EX if request.node.get_closest_marker("alone") else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(_test_processes_lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def es_url():
    """An Elasticsearch-compatible server for the whole run (noida-db unless ELASTICSEARCH_URL)."""
    with elasticsearch_url() as url:
        yield url


@pytest.fixture
def backend(lock_config):
    """The backend of the module's ``lock_config`` (an empty store)."""
    backend = load_backend(lock_config)
    yield backend
    backend.close()


PEERS_KEPT = 4
"""Idle peer processes kept for later tests (one per store config in use, LRU): each is an interpreter."""


@pytest.fixture(scope="session")
def _idle_peers():
    """Peers between tests, by config: spawning an interpreter per test was a third of the contract's time."""
    idle: collections.OrderedDict[str, Peer] = collections.OrderedDict()
    yield idle
    for peer in idle.values():
        peer.close()


@pytest.fixture
def peer(lock_config, _idle_peers):
    """A second process using the same store, holding nothing (reused from an earlier test after a reset)."""
    key = json.dumps(lock_config, sort_keys=True, default=repr)
    peer = _idle_peers.pop(key, None)
    if peer is None or not peer.process.is_alive():
        peer = Peer(lock_config)
    yield peer
    if not peer.process.is_alive():
        return  # the test killed it, or it died (which failed the test on its next call)
    try:
        peer.reset()
    except (AssertionError, TimeoutError):  # it could not give everything back: a later test gets a new one
        peer.close()
        return
    _idle_peers[key] = peer
    while len(_idle_peers) > PEERS_KEPT:
        _idle_peers.popitem(last=False)[1].close()


class SharedStores:
    """One store of each kind for the run, emptied between tests, replaced when a test left it changed.

    Making a store (an index, a database, a file) and its tables per test
    was most of the setup time of the suite; emptying one costs a few
    requests. A store whose reset fails (a test deleted, remapped or locked
    it) is dropped and a fresh one takes its place, so no test sees another's
    leftovers.
    """

    def __init__(self, request, django_db_blocker) -> None:
        self._request = request
        self._blocker = django_db_blocker
        self._stores: dict[str, tuple[dict, Callable[[], bool], contextlib.ExitStack]] = {}

    def _make(self, kind: str) -> tuple[dict, Callable[[], bool], contextlib.ExitStack]:
        stack = contextlib.ExitStack()
        if kind == "elasticsearch":
            made = stack.enter_context(shared_es_store(self._request.getfixturevalue("es_url")))
        else:
            with self._blocker.unblock():  # the tables are made through Django's connections
                made = stack.enter_context(shared_db_store(kind))
        return (*made, stack)

    def get(self, kind: str) -> dict:
        """Return a config on the empty store of ``kind``."""
        found = self._stores.get(kind)
        if found is not None:
            _, reset, stack = found
            try:
                emptied = reset()
            except Exception:  # noqa: BLE001 - any failure to empty it: take a fresh one
                emptied = False
            if not emptied:
                del self._stores[kind]
                with contextlib.suppress(Exception), self._blocker.unblock():
                    stack.close()
                found = None
        if found is None:
            found = self._stores[kind] = self._make(kind)
        return copy.deepcopy(found[0])

    def close(self) -> None:
        with self._blocker.unblock():
            for _, _, stack in self._stores.values():
                # noida-db (es_url) may be stopped first: its data went with it.
                with contextlib.suppress(LockBackendUnavailable):
                    stack.close()


@pytest.fixture(scope="session")
def shared_stores(request, django_db_blocker):
    """The run's :class:`SharedStores`: ``shared_stores.get(kind)`` is a config on an empty store of that kind."""
    stores = SharedStores(request, django_db_blocker)
    yield stores
    stores.close()


@pytest.fixture(params=store_params())
def store_config(request, shared_stores, django_db_blocker):
    """A LOCK_BACKEND config on an empty store of each kind (one per kind for the run, emptied before each test)."""
    config = shared_stores.get(request.param)
    if request.param == "elasticsearch":
        yield config
        return
    # The database backend opens its own connections, which pytest-django blocks by default.
    with django_db_blocker.unblock():
        yield config


@pytest.fixture(params=store_params())
def fresh_store_config(request, django_db_blocker):
    """A LOCK_BACKEND config on a store of each kind made for this test alone, removed afterwards.

    For tests of what a store's first use does (setup, a missing index or
    table, a token floor): ``store_config`` is emptied, not new.
    """
    if request.param == "elasticsearch":
        with es_store(request.getfixturevalue("es_url")) as config:
            yield config
        return
    store = postgres_store if request.param == "postgres" else sqlite_store
    # The database backend opens its own connections, which pytest-django blocks by default.
    with django_db_blocker.unblock(), store() as config:
        yield config
