"""Fixtures shared by every test module: the real stores."""

from __future__ import annotations

import pytest

from .stores import elasticsearch_url


@pytest.fixture(scope="session")
def es_url():
    """An Elasticsearch-compatible server for the whole run (noida-db unless ELASTICSEARCH_URL)."""
    with elasticsearch_url() as url:
        yield url
