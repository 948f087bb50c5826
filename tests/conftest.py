"""Fixtures shared by every test module: the real stores."""

from __future__ import annotations

import os

import pytest

from django_esdlock.conf import load_backend

from . import browser, throwaway_postgres
from .dbstores import database_url, fresh_database, postgres_store, sqlite_store
from .peer import Peer
from .stores import elasticsearch_url, es_store

if os.environ.get("ESDLOCK_ES") == "noida":  # the local override: noida-db even where an Elasticsearch is configured
    os.environ.pop("ELASTICSEARCH_URL", None)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    """Mark the tests of ``test_*_browser.py`` modules ``browser`` (they drive Chromium), the benchmark's ``bench``."""
    for item in items:
        if item.module.__name__.endswith("_browser"):
            item.add_marker(pytest.mark.browser)
        elif item.module.__name__.endswith(".test_bench"):
            item.add_marker(pytest.mark.bench)


def pytest_collection_finish(session):
    """Refuse to start, in one line, when a selected test needs a Chromium that is not there."""
    if not browser.chromium_present() and any(item.get_closest_marker("browser") for item in session.items):
        raise pytest.UsageError(f"{browser.MISSING}; or deselect the browser tests with -m 'not browser'")


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


@pytest.fixture
def peer(lock_config):
    """A second process using the same store."""
    peer = Peer(lock_config)
    yield peer
    peer.close()


STORES = ["elasticsearch", "postgres", "sqlite"]


@pytest.fixture(params=STORES)
def store_config(request, django_db_blocker):
    """A LOCK_BACKEND config on a fresh, empty store of each kind, removed afterwards."""
    if request.param == "elasticsearch":
        with es_store(request.getfixturevalue("es_url")) as config:
            yield config
        return
    store = postgres_store if request.param == "postgres" else sqlite_store
    # The database backend opens its own connections, which pytest-django blocks by default.
    with django_db_blocker.unblock(), store() as config:
        yield config
