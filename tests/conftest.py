"""Fixtures shared by every test module: the real stores."""

from __future__ import annotations

import pytest

from django_esdlock.conf import load_backend

from .dbstores import postgres_store, sqlite_store
from .peer import Peer
from .stores import elasticsearch_url, es_store


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
