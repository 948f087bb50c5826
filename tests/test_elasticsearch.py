"""The contract suite and Elasticsearch-specific behaviour, against a real server."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_esdlock.backends.elasticsearch import MAPPING, PROPERTIES_OF_VERSION_1, ElasticsearchLockBackend
from django_esdlock.conf import load_backend
from django_esdlock.records import Kind, Node, WaitState

from .contract import LockBackendContract
from .listing_contract import ListingContract
from .reaper_contract import ReaperContract
from .stores import es_store


@pytest.fixture
def lock_config(es_url):
    with es_store(es_url) as config:
        yield config


class TestElasticsearchContract(LockBackendContract):
    pass


def test_index_has_one_shard_and_the_strict_mapping(lock_config):
    backend = load_backend(lock_config)
    backend.setup()
    index = lock_config["OPTIONS"]["index"]
    mapping = backend.client.indices.get_mapping(index=index)[index]["mappings"]
    assert mapping["dynamic"] == "strict"
    assert mapping["properties"] == MAPPING["properties"]
    settings = backend.client.indices.get_settings(index=index)[index]["settings"]["index"]
    assert settings["number_of_shards"] == "1"
    assert backend.check() == []


def test_an_index_of_the_first_mapping_is_flagged_then_gains_the_new_fields_at_first_use(lock_config):
    backend = load_backend(lock_config)
    index = lock_config["OPTIONS"]["index"]
    old = {
        "dynamic": "strict",
        "_meta": {"django_esdlock": {"mapping_version": 1}},
        "properties": PROPERTIES_OF_VERSION_1,
    }
    backend.client.indices.create(index=index, settings={"number_of_shards": 1}, mappings=old)
    assert [m.id for m in backend.check()] == ["django_esdlock.W006"]
    backend.setup()
    mapping = backend.client.indices.get_mapping(index=index)[index]["mappings"]
    assert mapping["properties"] == MAPPING["properties"] and mapping["_meta"] == MAPPING["_meta"]
    assert backend.check() == []


def test_reading_the_waiting_requests_creates_no_index(lock_config):
    backend = load_backend(lock_config)
    index = lock_config["OPTIONS"]["index"]
    node = Node("default", Kind.TREE, "/a")
    assert backend.wait_state() == backend.wait_state([node]) == WaitState((), ())
    assert not backend.client.indices.exists(index=index)


def test_construction_makes_no_request():
    backend = ElasticsearchLockBackend(hosts=["http://127.0.0.1:9"], index="never")
    assert backend._client is None


class TestElasticsearchReaper(ReaperContract):
    pass


class TestElasticsearchListing(ListingContract):
    pass


def test_reap_locks_reports_an_unreachable_store():
    unreachable = {
        "BACKEND": "django_esdlock.backends.elasticsearch.ElasticsearchLockBackend",
        "OPTIONS": {"hosts": ["http://127.0.0.1:9"], "index": "locks", "request_timeout": 1, "max_retries": 0},
    }
    with override_settings(LOCK_BACKEND=unreachable), pytest.raises(CommandError, match="reaping failed"):
        call_command("reap_locks", stdout=io.StringIO())
