"""Fixtures shared by every test module: the real stores."""

from __future__ import annotations

import pytest

from django_esdlock.conf import load_backend

from .peer import Peer
from .stores import elasticsearch_url


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
