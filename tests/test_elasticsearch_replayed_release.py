"""A release Elasticsearch executes twice (a new primary re-runs it after the old one applied it) is not a lost lock.

When the primary fails after it applied and replicated a write but before it
answered, the coordinating node sends the write again to the new primary,
which runs the script once more. Here the second execution is a second
release of the same grant at the store: the holder is already gone.
"""

from __future__ import annotations

import uuid

import pytest

from django_esdlock.backends.elasticsearch.protocol import RELEASE_TOMBSTONES_KEPT
from django_esdlock.modes import Mode
from django_esdlock.records import Kind, LockRequest, Node, Owner

from .expiry import expire
from .stores import es_backend
from .stores import node_source as source

OWNER = Owner.current()


@pytest.fixture
def backend(es_url):
    with es_backend(es_url) as backend:
        yield backend


def shared(path, ttl=30.0):
    return LockRequest(uuid.uuid4().hex, OWNER, ((Node("fs", Kind.TREE, path), Mode.S),), ttl)


def test_a_release_run_again_on_a_node_that_stays_is_not_lost(backend):
    first, second = backend.acquire(shared("/a")), backend.acquire(shared("/a"))
    assert first is not None and second is not None
    assert backend.release(first) is True
    tombstones = [w for w in source(backend, "/a")["waiters"] if w.get("released")]
    assert [(w["id"], w["by"]) for w in tombstones] == [(first.request.holder_id, OWNER.key)]
    assert backend.release(first) is True  # the replay finds its own tombstone
    assert backend.release(second) is True
    assert source(backend, "/a") is None  # a tombstone does not keep a node


def test_a_force_released_holder_is_still_lost(backend):
    mine, other = backend.acquire(shared("/a")), backend.acquire(shared("/a"))
    assert backend.force_release(mine.request.holder_id, mine.taken) is True
    assert backend.release(mine) is False  # the tombstone is the admin's (by null), not ours
    assert backend.release(other) is True


def test_an_evicted_holder_is_still_lost(backend):
    mine = backend.acquire(shared("/a"))
    expire(backend, mine.request.holder_id)
    other = backend.acquire(shared("/a"))  # ACQUIRE drops the expired holder: no tombstone
    assert other is not None
    assert backend.release(mine) is False
    assert backend.release(other) is True


def test_a_release_run_again_on_a_node_it_deleted_is_reported_lost(backend):
    # The documented limit: the last holder's release deletes the node, tombstone and all.
    grant = backend.acquire(shared("/z"))
    assert backend.release(grant) is True
    assert backend.release(grant) is False


def test_a_hot_node_keeps_only_the_newest_tombstones(backend):
    stays = backend.acquire(shared("/hot"))
    grants = [backend.acquire(shared("/hot")) for _ in range(RELEASE_TOMBSTONES_KEPT + 4)]
    for grant in grants:
        assert backend.release(grant) is True
    tombstones = [w["id"] for w in source(backend, "/hot")["waiters"] if w.get("released")]
    assert tombstones == [g.request.holder_id for g in grants[-RELEASE_TOMBSTONES_KEPT:]]
    assert backend.release(grants[-1]) is True and backend.release(grants[0]) is False
    assert backend.release(stays) is True
    assert source(backend, "/hot") is None


def test_a_request_that_takes_the_node_again_drops_its_tombstone(backend):
    # A waiting request keeps its holder id: a give-back leaves a tombstone, the next try takes the node again.
    other = backend.acquire(shared("/a"))
    request = shared("/a")
    first = backend.acquire(request)
    assert backend.release(first) is True  # as a give-back would: tombstone of this holder id
    again = backend.acquire(request)
    assert again is not None
    assert not [w for w in source(backend, "/a")["waiters"] if w.get("released")]
    expire(backend, request.holder_id)
    third = backend.acquire(shared("/a"))  # evicts the expired holder: no tombstone of ours may vouch for it
    assert backend.release(again) is False
    assert backend.release(third) is True and backend.release(other) is True
