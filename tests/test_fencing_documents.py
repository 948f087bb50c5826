"""Fenced Elasticsearch documents: the Painless script as the node runs it (the genuine one in CI)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from django_esdlock import InvalidLockArgument, LockLost, StaleFence, lock_tree
from django_esdlock.conf import load_backend
from django_esdlock.fencing import (
    FencedDocument,
    FencedWriteFailed,
    afenced_update_document,
    fenced_update_document,
    fenced_update_documents,
)
from tests.stores import es_store

pytestmark = pytest.mark.elasticsearch


@pytest.fixture(scope="module")
def client(es_url):
    from elasticsearch import Elasticsearch

    with Elasticsearch(es_url) as client:
        yield client


@pytest.fixture
def index(client):
    """A data index of this test (``fence`` a long, ``path`` a keyword), deleted after."""
    name = f"test-fenced-{uuid.uuid4().hex[:12]}"
    client.indices.create(index=name, mappings={"properties": {"fence": {"type": "long"}, "path": {"type": "keyword"}}})
    for doc_id, fence in (("a", 3), ("b", 3), ("c", 3)):
        client.index(index=name, id=doc_id, document={"path": f"/{doc_id}", "fence": fence})
    client.indices.refresh(index=name)
    yield name
    client.indices.delete(index=name)


def sources(client, index):
    return {doc_id: client.get(index=index, id=doc_id)["_source"] for doc_id in ("a", "b", "c")}


def test_a_write_not_older_than_the_fence_merges_and_stamps(client, index):
    assert fenced_update_document(client, index, "a", {"path": "/x", "size": 7}, 5) == "updated"
    assert fenced_update_document(client, index, "a", {"path": "/y"}, 5) == "updated"  # the same holder again
    # An Elasticsearch token: the primary term above bit 40, beyond a double's exact ints once summed.
    big = (7 << 40) + 123
    assert fenced_update_document(client, index, "b", {"path": "/z"}, big) == "updated"
    assert sources(client, index) == {
        "a": {"path": "/y", "size": 7, "fence": 5},
        "b": {"path": "/z", "fence": big},
        "c": {"path": "/c", "fence": 3},
    }


def test_an_older_token_is_refused_with_the_newer_one(client, index):
    fenced_update_document(client, index, "a", {"path": "/new"}, 9)
    with pytest.raises(StaleFence, match="newer than 5") as refused:
        fenced_update_document(client, index, "a", {"path": "/stale"}, 5)
    assert (refused.value.token, refused.value.newer) == (5, 9)
    assert sources(client, index)["a"] == {"path": "/new", "fence": 9}


def test_expect_unmet_missing_and_upsert(client, index):
    assert fenced_update_document(client, index, "a", {"path": "/x"}, 5, expect={"path": "/elsewhere"}) == "unmatched"
    assert fenced_update_document(client, index, "a", {"path": "/x"}, 5, expect={"path": "/a"}) == "updated"
    assert fenced_update_document(client, index, "nope", {"path": "/n"}, 5) == "missing"
    assert fenced_update_document(client, index, "new", {"path": "/n"}, 5, upsert=True, refresh=True) == "updated"
    assert client.get(index=index, id="new")["_source"] == {"path": "/n", "fence": 5}
    assert client.count(index=index)["count"] == 4  # "nope" was not created
    assert sources(client, index)["a"] == {"path": "/x", "fence": 5}


def test_bulk_refuses_the_newer_documents_and_writes_the_others(client, index):
    fenced_update_document(client, index, "b", {"path": "/newer"}, 9)
    updates = [FencedDocument("a", {"path": "/1"}), ("b", {"path": "/2"}), ("c", {"path": "/3"}, {"path": "/c"})]
    with pytest.raises(StaleFence, match="1 document") as refused:
        fenced_update_documents(client, index, updates, 5)
    assert refused.value.newer == 9
    # No transaction across documents: what was not refused was written (the docs say so).
    assert sources(client, index) == {
        "a": {"path": "/1", "fence": 5},
        "b": {"path": "/newer", "fence": 9},
        "c": {"path": "/3", "fence": 5},
    }
    writes = fenced_update_documents(client, index, [("a", {"path": "/4"}), ("c", {"path": "/5"}, {"path": "/x"})], 6)
    assert (writes.updated, writes.unmatched, writes.missing) == (["a"], ["c"], [])


def test_bad_input_sends_nothing(client, index):
    for bad in (-1, 0, True, "5", None, 2**63):
        with pytest.raises(InvalidLockArgument):
            fenced_update_document(client, index, "a", {"path": "/x"}, bad)
    with pytest.raises(InvalidLockArgument, match="is the fence"):
        fenced_update_document(client, index, "a", {"fence": 99}, 5)
    with pytest.raises(InvalidLockArgument, match="must be a dict"):
        fenced_update_document(client, index, "a", ["path"], 5)
    with pytest.raises(InvalidLockArgument, match="id"):
        fenced_update_document(client, index, "", {"path": "/x"}, 5)
    with pytest.raises(InvalidLockArgument, match="at least one"):
        fenced_update_documents(client, index, [], 5)
    assert sources(client, index)["a"] == {"path": "/a", "fence": 3}


def test_a_failed_write_is_not_a_refusal(client, index):
    with pytest.raises(FencedWriteFailed) as failed:
        fenced_update_document(client, index, "a", {"fence_note": "x", "path": {"not": "a keyword"}}, 5)
    assert list(failed.value.errors) == ["a"]


def test_a_lock_is_checked_and_its_namespace_compared(client, index, es_url):
    with es_store(es_url) as config:
        backend = load_backend(config)
        try:
            with lock_tree("/a", namespace="files", backend=backend) as lock:
                assert fenced_update_document(client, index, "a", {"path": "/x"}, lock, namespace="files") == "updated"
                with pytest.raises(InvalidLockArgument, match="namespace 'files'"):
                    fenced_update_document(client, index, "a", {"path": "/y"}, lock, namespace="orders")
                token = lock.token
            with pytest.raises(LockLost, match="not held"):  # released
                fenced_update_document(client, index, "a", {"path": "/z"}, lock)
        finally:
            backend.close()
    assert sources(client, index)["a"] == {"path": "/x", "fence": token}


def test_async_twin(es_url, index, client):
    from elasticsearch import AsyncElasticsearch

    async def write():
        async with AsyncElasticsearch(es_url) as aclient:
            assert await afenced_update_document(aclient, index, "a", {"path": "/x"}, 5) == "updated"
            with pytest.raises(StaleFence):
                await afenced_update_document(aclient, index, "a", {"path": "/y"}, 4)

    asyncio.run(write())
    assert sources(client, index)["a"] == {"path": "/x", "fence": 5}


def test_expect_compares_lists_a_list_append_as_compare_and_set(client, index):
    """What a list-append workload (lock_check's guarded data) needs: append only to the list it read."""
    client.index(index=index, id="ops", document={"ops": ["1-a"], "fence": 0}, refresh=True)
    assert fenced_update_document(client, index, "ops", {"ops": ["1-a", "2-b"]}, 5, expect={"ops": ["1-a"]}) == (
        "updated"
    )
    assert fenced_update_document(client, index, "ops", {"ops": ["1-a", "x"]}, 5, expect={"ops": ["1-a"]}) == (
        "unmatched"
    )
    assert client.get(index=index, id="ops")["_source"] == {"ops": ["1-a", "2-b"], "fence": 5}
