"""The cluster OPTIONS of the Elasticsearch backend, without a store: validation, index choice, durability."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_esdlock.backends.elasticsearch import (
    UNDER_REPLICATED,
    ElasticsearchLockBackend,
    _copies,
    _under_replicated,
    index_of_namespace,
)


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
