"""The cluster OPTIONS of the Elasticsearch backend, without a store: validation, index choice, durability."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_esdlock.backends.elasticsearch import ElasticsearchLockBackend
from django_esdlock.backends.elasticsearch.answers import UNDER_REPLICATED
from django_esdlock.backends.elasticsearch.answers import under_replicated as _under_replicated
from django_esdlock.backends.elasticsearch.index import copies_of as _copies
from django_esdlock.backends.elasticsearch.options import index_of_namespace


@pytest.mark.parametrize(
    "options",
    [
        {"number_of_replicas": -1},
        {"number_of_replicas": "two"},
        {"wait_for_active_shards": 0},
        {"wait_for_active_shards": "majority"},
        {"index_count": 0},
        {"namespace_indices": {"orders": "_bad"}},
    ],
)
def test_bad_cluster_options_are_refused(options):
    with pytest.raises(ImproperlyConfigured):
        ElasticsearchLockBackend(**options)


def test_namespaces_go_to_one_index_by_default_and_spread_when_asked():
    assert index_of_namespace("fs", "locks", 1, {}) == "locks"
    spread = {index_of_namespace(f"ns{i}", "locks", 3, {}) for i in range(30)}
    assert spread == {"locks-0", "locks-1", "locks-2"}
    assert index_of_namespace("orders", "locks", 3, {"orders": "locks-orders"}) == "locks-orders"
    backend = ElasticsearchLockBackend(index="locks", index_count=2, namespace_indices={"orders": "locks-orders"})
    assert backend.lock_indices == ("locks-0", "locks-1", "locks-orders")
    assert ElasticsearchLockBackend().lock_indices == ("locks",)


def test_copies_follow_auto_expand_and_the_cluster_size():
    assert _copies("0-2", 1) == 1
    assert _copies("0-2", 2) == 2
    assert _copies("0-2", 5) == 3
    assert _copies("0-all", 4) == 4
    assert _copies(1, 1) == 2  # a fixed replica count, assigned or not


def test_a_write_to_too_few_copies_reads_as_busy():
    written = {"update": {"result": "updated", "status": 200, "_shards": {"total": 3, "successful": 1, "failed": 2}}}
    judged = _under_replicated(written, 2)
    assert judged["update"]["status"] == 503
    assert judged["update"]["error"]["type"] == UNDER_REPLICATED
    assert _under_replicated(written, 1) is written
    refused = {"update": {"result": "noop", "status": 200, "_shards": {"total": 0, "successful": 0, "failed": 0}}}
    assert _under_replicated(refused, 2) is refused


def test_check_warns_when_one_node_loss_would_lose_a_grant():
    backend = ElasticsearchLockBackend(number_of_replicas=0)
    (warning,) = backend._durability_warnings("locks", backend._index_settings(), 3)
    assert warning.id == "django_esdlock.W005"
    assert backend._durability_warnings("locks", backend._index_settings(), 1) == []  # nothing to lose
    acks_alone = ElasticsearchLockBackend(wait_for_active_shards=1)
    assert [w.id for w in acks_alone._durability_warnings("locks", acks_alone._index_settings(), 3)] == [
        "django_esdlock.W005"
    ]
    assert ElasticsearchLockBackend()._durability_warnings("locks", {"auto_expand_replicas": "0-2"}, 3) == []


def test_listing_reaping_and_check_cover_every_lock_index(es_url):
    """Namespaces spread over indices: one listing, one reap, one check see them all."""
    import uuid

    from django_esdlock import lock_tree
    from django_esdlock.conf import load_backend

    from .leases import backdate
    from .stores import ES_BACKEND

    base = f"test-spread-{uuid.uuid4().hex[:10]}"
    options = {"hosts": [es_url], "index": base, "index_count": 2, "namespace_indices": {"orders": f"{base}-orders"}}
    config = {"BACKEND": ES_BACKEND, "OPTIONS": options, "TTL": 30}
    backend = load_backend(config)
    try:
        names = ["orders", *(f"ns{i}" for i in range(6))]
        assert len({backend.index_of(n) for n in names}) == 3
        locks = [lock_tree("/a", namespace=n, backend=backend).acquire() for n in names]
        assert {r.node.namespace for r in backend.holders(limit=100).holders} == set(names)
        assert [r.node.namespace for r in backend.holders(namespace="orders").holders] == ["orders"]
        assert backend.check() == []
        for lock in locks:
            holder = lock.holder_id
            lock._grant = None  # abandoned: left to the lease and the reaper
            backdate(config, holder)  # whose lease ran out, by the store's clock
        assert {r.node.namespace for r in backend.evict_expired()} == set(names)
        assert backend.holders().holders == []
    finally:
        backend.delete_indices()
        backend.close()
