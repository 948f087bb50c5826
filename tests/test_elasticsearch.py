"""Elasticsearch-specific behaviour (setup, mappings, what a request may carry), against a real server."""

from __future__ import annotations

import contextlib
import io
import socket

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_esdlock import LockBackendUnavailable, lock_tree
from django_esdlock.backends.elasticsearch import ElasticsearchLockBackend
from django_esdlock.backends.elasticsearch.index import (
    MAPPING,
    PROPERTIES_OF_VERSION_1,
    PROPERTIES_OF_VERSION_2,
    PROPERTIES_OF_VERSION_3,
    PROPERTIES_OF_VERSION_4,
)
from django_esdlock.backends.elasticsearch.protocol import HEAD_POLL_FLOOR
from django_esdlock.conf import load_backend
from django_esdlock.modes import Mode
from django_esdlock.records import Kind, LockRequest, Node, WaitState

from . import waiting_state
from .stores import es_store


@pytest.fixture
def lock_config(es_url):
    """A fresh lock index: this module's tests are of setup and mappings (the contract runs in tests/contract/)."""
    with es_store(es_url) as config:
        yield config


def test_index_has_one_shard_and_the_strict_mapping(lock_config):
    backend = load_backend(lock_config)
    backend.setup()
    index = lock_config["OPTIONS"]["index"]
    # The lock index is an alias of its incarnation, whose name carries its token floor.
    assert backend.concrete_indices() == {f"{index}.floor-0": index}
    ((concrete, found),) = backend.client.indices.get_mapping(index=index).items()
    assert concrete == f"{index}.floor-0"
    assert found["mappings"]["dynamic"] == "strict"
    assert found["mappings"]["properties"] == MAPPING["properties"]
    settings = backend.client.indices.get_settings(index=index)[concrete]["settings"]["index"]
    assert settings["number_of_shards"] == "1"
    assert backend.check() == []


@pytest.mark.parametrize(
    "version, properties",
    [
        (1, PROPERTIES_OF_VERSION_1),
        (2, PROPERTIES_OF_VERSION_2),
        (3, PROPERTIES_OF_VERSION_3),
        (4, PROPERTIES_OF_VERSION_4),
    ],
)
def test_an_index_of_an_earlier_mapping_is_flagged_then_gains_the_new_fields_at_first_use(
    lock_config, version, properties
):
    backend = load_backend(lock_config)
    index = lock_config["OPTIONS"]["index"]
    old = {"dynamic": "strict", "_meta": {"django_esdlock": {"mapping_version": version}}, "properties": properties}
    backend.client.indices.create(
        index=f"{index}.floor-0",
        settings={"number_of_shards": 1},
        mappings=old,
        aliases={index: {"is_write_index": True}},
    )
    assert [m.id for m in backend.check()] == ["django_esdlock.W006"]
    backend.setup()
    mapping = backend.client.indices.get_mapping(index=index)[f"{index}.floor-0"]["mappings"]
    assert mapping["properties"] == MAPPING["properties"] and mapping["_meta"] == MAPPING["_meta"]
    assert backend.check() == []
    with lock_tree("/a", backend=backend) as lock:
        assert lock.token > 0


def test_a_lock_index_of_an_earlier_release_is_used_as_it_is_and_flagged(lock_config):
    """A concrete index named like the lock index (no alias) with the lock mapping: kept, with check W008."""
    backend = load_backend(lock_config)
    index = lock_config["OPTIONS"]["index"]
    old = {
        "dynamic": "strict",
        "_meta": {"django_esdlock": {"mapping_version": 2}},
        "properties": PROPERTIES_OF_VERSION_2,
    }
    backend.client.indices.create(index=index, settings={"number_of_shards": 1}, mappings=old)
    with lock_tree("/a", backend=backend) as lock:
        assert lock.token > 0
        assert [r.node.key for r in backend.holders().holders] == ["/a"]
    assert backend.concrete_indices() == {index: index}
    assert [m.id for m in backend.check()] == ["django_esdlock.W008"]


def test_reading_the_waiting_requests_creates_no_index(lock_config):
    backend = load_backend(lock_config)
    index = lock_config["OPTIONS"]["index"]
    node = Node("default", Kind.TREE, "/a")
    assert backend.wait_state() == backend.wait_state([node]) == WaitState((), ())
    assert not backend.client.indices.exists(index=index)


def _waiting_request(name: str, *, ticket: int, holds_others: bool = False) -> LockRequest:
    owner = waiting_state.owner(name)
    return LockRequest(f"{name}-waits", owner, ((NODE, Mode.X),), 30, ticket=ticket, holds_others=holds_others)


NODE = Node("default", Kind.TREE, "/hot")


def test_a_waiting_marker_keeps_only_who_waits(lock_config):
    """A busy node keeps one marker per waiting request and every write rewrites them all: markers stay small."""
    backend = load_backend(lock_config)
    waiting_state.hold(backend, "holder", NODE.key, namespace=NODE.namespace)
    assert backend.acquire(_waiting_request("alone", ticket=1)) is None
    assert backend.acquire(_waiting_request("nested", ticket=2, holds_others=True)) is None
    source = backend.client.get(index=backend.index_of(NODE.namespace), id=NODE.id)["_source"]
    alone, nested = sorted(source["waiters"], key=lambda w: w["ticket"])
    who = {"host", "pid", "thread_name"}
    assert set(alone) == {"id", "mode", "ticket", "expires_at"} | who
    # Only an owner that holds other locks can be in a deadlock: its marker names it.
    assert set(nested) == {"id", "mode", "ticket", "expires_at", "owner"} | who
    assert nested["owner"] == waiting_state.owner("nested").key
    # The wait-for graph reads both: the one without a key stands for its own owner.
    state = backend.wait_state([NODE])
    owners = {w.holder_id: (w.owner_key, w.owner["thread_name"]) for w in state.waiters}
    assert owners == {"alone-waits": ("?alone-waits", "alone"), "nested-waits": (nested["owner"], "nested")}


def test_a_request_far_back_in_a_queue_polls_less_often_than_its_head(lock_config):
    backend = load_backend(lock_config)
    waiting_state.hold(backend, "holder", NODE.key, namespace=NODE.namespace)
    queue = [_waiting_request(f"w{i}", ticket=i) for i in range(1, 6)]
    for request in queue:
        assert backend.acquire(request) is None
    for request in queue:  # each tries again: the store tells it its place
        assert backend.acquire(request) is None
    intervals = [backend.queued_poll_interval(r) for r in queue]
    # The head: the next release is its; it polls about once per try's answer time, queued_poll_cap at most.
    assert HEAD_POLL_FLOOR <= intervals[0] <= backend.queued_poll_cap
    assert intervals == sorted(intervals) and intervals[-1] > intervals[0]
    assert intervals[-1] <= backend.marker_ttl / 3  # its polls still keep its marker alive


def test_construction_makes_no_request():
    """A listener on the backend's host sees no connection while it is built and described, one at its first use."""
    with contextlib.closing(socket.create_server(("127.0.0.1", 0))) as listener:
        host = f"http://127.0.0.1:{listener.getsockname()[1]}"
        backend = ElasticsearchLockBackend(hosts=[host], index="never", request_timeout=0.5, max_retries=0)
        assert "127.0.0.1" in backend.describe() and backend.lock_indices == ("never",)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # no connection waits to be accepted
            listener.accept()
        listener.settimeout(30)
        with pytest.raises(LockBackendUnavailable):  # the listener never answers
            backend.holders()
        connection, _ = listener.accept()  # the control: a request does reach it
        connection.close()
        backend.close()


def test_reap_locks_reports_an_unreachable_store():
    unreachable = {
        "BACKEND": "django_esdlock.backends.elasticsearch.ElasticsearchLockBackend",
        "OPTIONS": {"hosts": ["http://127.0.0.1:9"], "index": "locks", "request_timeout": 1, "max_retries": 0},
    }
    with override_settings(LOCK_BACKEND=unreachable), pytest.raises(CommandError, match="reaping failed"):
        call_command("reap_locks", stdout=io.StringIO())
