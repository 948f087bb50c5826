"""The fixtures that share stores and peers between tests leave nothing of one test to the next."""

from __future__ import annotations

import pytest

from django_esdlock import lock_tree
from django_esdlock.conf import load_backend
from django_esdlock.modes import Mode

from .contract import STORES, all_holders, raw_grant
from .peer import Peer
from .stores import es_store


@pytest.fixture(autouse=True)
def _db_access(django_db_blocker):
    """The lock backends open connections of their own; pytest-django blocks them unless told."""
    with django_db_blocker.unblock():
        yield


@pytest.mark.parametrize("kind", STORES)
def test_the_next_test_finds_the_store_empty_and_tokens_still_growing(shared_stores, kind):
    config = shared_stores.get(kind)
    backend = load_backend(config)
    try:
        left = raw_grant(backend, "/left/behind", Mode.X, ttl=300)  # never released: a test "forgot" it
        assert [h.holder_id for h in all_holders(backend)] == [left.request.holder_id]
    finally:
        backend.close()

    again = shared_stores.get(kind)
    assert again["OPTIONS"] == config["OPTIONS"]  # the same store, emptied, not a new one
    backend = load_backend(again)
    try:
        assert all_holders(backend) == []
        with lock_tree("/left", timeout=0, backend=backend) as lock:
            assert lock.token > left.token  # fencing tokens never go back from one test to the next
    finally:
        backend.close()


def test_an_index_a_test_deleted_is_replaced_by_a_fresh_one(shared_stores):
    config = shared_stores.get("elasticsearch")
    backend = load_backend(config)
    backend.delete_indices()
    backend.close()
    again = shared_stores.get("elasticsearch")
    assert again["OPTIONS"]["index"] != config["OPTIONS"]["index"]
    backend = load_backend(again)
    try:
        assert backend.check() == [] and all_holders(backend) == []
    finally:
        backend.close()


def test_a_reset_peer_holds_nothing_and_is_the_same_process(es_url):
    with es_store(es_url) as config:
        peer = Peer(config)
        try:
            pid = peer.pid()
            assert "token" in peer.acquire("a", scheme="tree", path="/held")
            peer.reset()
            assert peer.pid() == pid
            backend = load_backend(config)
            try:
                assert all_holders(backend) == []
            finally:
                backend.close()
        finally:
            peer.close()
