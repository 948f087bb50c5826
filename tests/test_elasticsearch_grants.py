"""Fresh nodes are taken with the chapter's ``create``, their lease stamped by the store's ingest pipeline."""

from __future__ import annotations

import datetime
import logging
import time
import uuid

import pytest

from django_esdlock.backends.elasticsearch import grants, scripts
from django_esdlock.backends.elasticsearch.grants import DEFAULT_PIPELINE, pipeline_body
from django_esdlock.conf import load_backend
from django_esdlock.exceptions import InvalidLockBackend
from django_esdlock.locks import global_lock, lock_tree
from django_esdlock.records import Kind, Node

from .stores import ES_BACKEND, es_store
from .stores import node_source as source
from .stores import recorded_bulks as recorded
from .stores import tree_request as tree


@pytest.fixture
def store(es_url):
    with es_store(es_url) as config:
        yield config


@pytest.fixture
def own_pipeline(store):
    """A config whose grant pipeline is this test's alone (the default one is shared by the whole run)."""
    name = f"esdlock-grant-test-{uuid.uuid4().hex[:8]}"
    config = {**store, "OPTIONS": {**store["OPTIONS"], "grant_pipeline": name}}
    yield config
    backend = load_backend(config)
    backend.client.options(ignore_status=404).ingest.delete_pipeline(id=name)
    backend.close()


@pytest.mark.parametrize(
    "stamp",
    [
        "2026-11-26T14:08:17.066Z",
        "2026-11-26T14:08:17.066123Z",
        "2026-11-26T14:08:17.066123456Z",
        "2026-11-26T14:08:17Z",
        "2026-11-26T14:08Z",
        "1970-01-01T00:00Z",
        "2000-02-29T23:59:59.999Z",
        "2024-03-01T00:00:00.001Z",
        "2100-01-01T12:00:00.5Z",
        "2399-12-31T23:59:59.999999999Z",
    ],
)
def test_the_grant_script_reads_every_form_the_ingest_clock_is_written_in(store, stamp):
    backend = load_backend(store)
    try:
        pipeline = {"processors": [{"script": {"lang": "painless", "source": scripts.compact(scripts.GRANT)}}]}
        holder = {"id": "h", "mode": "X", "lease_ms": 30_000}
        answer = backend.client.ingest.simulate(
            pipeline=pipeline, docs=[{"_source": {"lease_stamp": stamp, "holders": [holder]}}]
        )
    finally:
        backend.close()
    written = answer["docs"][0]["doc"]["_source"]
    expected_ms = _ms(stamp)
    stamped = {"id": "h", "mode": "X", "acquired_at": expected_ms, "expires_at": expected_ms + 30_000}
    assert written == {"holders": [stamped]}


def _ms(stamp: str) -> int:
    """Epoch milliseconds of an ISO stamp with a fraction of any length, truncated to the millisecond."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = datetime.datetime.fromisoformat(whole + "+00:00").timestamp()
    return int(seconds) * 1000 + int((fraction + "000")[:3])


def test_a_fresh_lease_is_stamped_by_the_store_between_send_and_answer(store):
    backend = load_backend(store)
    backend.setup()
    try:
        before = time.time()
        grant = backend.acquire(tree(("/a", "IX"), ("/a/b", "X")))
        after = time.time()
        assert grant is not None
        for key in ("/a", "/a/b"):
            (holder,) = source(backend, key)["holders"]
            assert holder["expires_at"] - holder["acquired_at"] == 30_000
            # The same machine's clock: the stamp lies between the send and the answer (milliseconds, truncated).
            assert int(before * 1000) - 1 <= holder["acquired_at"] <= after * 1000 + 1
            assert "lease_ms" not in holder and "lease_stamp" not in source(backend, key)
        assert backend.release(grant) is True
    finally:
        backend.close()


def test_an_uncontended_tree_lock_is_one_bulk_of_creates_and_one_of_conditional_deletes(store):
    backend = load_backend(store)
    backend.setup()
    sent = recorded(backend)
    try:
        with lock_tree("/a/b/c", namespace="fs", backend=backend):
            pass
    finally:
        backend.close()
    acquire, release = sent
    assert [verb for verb, _, _ in acquire] == ["create", "create", "create"]
    assert {header["pipeline"] for _, header, _ in acquire} == {DEFAULT_PIPELINE}
    # Deepest first: an ancestor's entry is written after its main node (see "Ancestors" in the protocol).
    assert [body["key"] for _, _, body in acquire] == ["/a/b/c", "/a/b", "/a"]
    assert [body["holders"][0].get("main") for _, _, body in acquire] == [
        None,
        *[Node("fs", Kind.TREE, "/a/b/c").id] * 2,
    ]
    # Each node deleted if unchanged; the main node's RELEASE rides behind its delete (for a waiter's marker).
    assert [(verb, header["_id"]) for verb, header, _ in release] == [
        ("delete", Node("fs", Kind.TREE, "/a/b/c").id),
        ("update", Node("fs", Kind.TREE, "/a/b/c").id),
        ("delete", Node("fs", Kind.TREE, "/a/b").id),
        ("delete", Node("fs", Kind.TREE, "/a").id),
    ]


def test_the_global_lock_is_the_chapters_create_when_nobody_holds_it(store):
    backend = load_backend(store)
    backend.setup()
    sent = recorded(backend)
    try:
        with global_lock(backend=backend) as lock:
            assert lock.token > 0
    finally:
        backend.close()
    ((verb, header, body),) = sent[0]
    assert verb == "create" and header["_id"] == Node("default", Kind.GLOBAL, "global").id
    assert body["holders"][0]["lease_ms"] == 30_000


def test_a_create_that_finds_its_node_falls_back_to_acquire_in_a_second_bulk(store):
    first, second = load_backend(store), load_backend(store)  # the second knows nothing of /a
    try:
        held = first.acquire(tree(("/a", "IX"), ("/a/b", "X")))
        sent = recorded(second)
        joined = second.acquire(tree(("/a", "IX"), ("/a/c", "X")))
        assert held is not None and joined is not None and joined.token > held.token
        creates, retried = sent
        assert [verb for verb, _, _ in creates] == ["create", "create"]
        assert [(verb, header["_id"]) for verb, header, _ in retried] == [("update", Node("fs", Kind.TREE, "/a").id)]
        assert sorted(h["id"] for h in source(first, "/a")["holders"]) == sorted(
            [held.request.holder_id, joined.request.holder_id]
        )
        assert second.release(joined) is True and first.release(held) is True
        # Neither alone wrote /a: both entries stay behind, and hold nothing (see "Ancestors").
        assert len(source(first, "/a")["holders"]) == 2
        assert first.holders(namespace="fs").holders == []
        third = load_backend(store)  # left nothing there itself: it reads their main nodes, then drops them
        try:
            taken = third.acquire(tree(("/a", "X")))
            assert taken is not None
            assert [h["id"] for h in source(third, "/a")["holders"]] == [taken.request.holder_id]
            assert third.release(taken) is True
        finally:
            third.close()
    finally:
        first.close()
        second.close()


def test_a_refused_create_leaves_the_holder_alone(store):
    first, second = load_backend(store), load_backend(store)
    try:
        held = first.acquire(tree(("/x", "X")))
        assert second.acquire(tree(("/x", "X"))) is None
        (holder,) = source(first, "/x")["holders"]
        assert holder["id"] == held.request.holder_id
        assert first.release(held) is True
    finally:
        first.close()
        second.close()


def test_a_lost_pipeline_costs_no_grant_and_is_installed_again(own_pipeline, caplog):
    backend = load_backend(own_pipeline)
    backend.setup()
    name = own_pipeline["OPTIONS"]["grant_pipeline"]
    try:
        backend.client.ingest.delete_pipeline(id=name)
        sent = recorded(backend)
        with caplog.at_level(logging.WARNING, logger="django_esdlock"):
            grant = backend.acquire(tree(("/p", "X")))
        assert grant is not None
        assert [[verb for verb, _, _ in bulk] for bulk in sent] == [["create"], ["update"]]
        assert "grant pipeline failed" in caplog.text
        assert backend.release(grant) is True
        again = backend.acquire(tree(("/q", "X")))  # verifies the pipeline, installs it, and creates
        assert again is not None and sent[-1][0][0] == "create"
        assert name in backend.client.ingest.get_pipeline(id=name)
        assert backend.release(again) is True
    finally:
        backend.close()


def test_no_grant_pipeline_takes_fresh_nodes_with_the_scripted_upsert(store):
    config = {**store, "OPTIONS": {**store["OPTIONS"], "grant_pipeline": None}}
    backend = load_backend(config)
    backend.setup()
    sent = recorded(backend)
    try:
        with lock_tree("/a/b", namespace="fs", backend=backend):
            (holder,) = source(backend, "/a/b")["holders"]
            assert holder["expires_at"] - holder["acquired_at"] == 30_000
        assert [verb for verb, _, _ in sent[0]] == ["update", "update"]
        assert backend.check() == []
    finally:
        backend.close()


def test_check_warns_of_a_pipeline_that_is_not_ours_and_setup_replaces_it(own_pipeline):
    backend = load_backend(own_pipeline)
    name = own_pipeline["OPTIONS"]["grant_pipeline"]
    try:
        backend.client.ingest.put_pipeline(id=name, processors=[{"set": {"field": "x", "value": "1"}}])
        assert [m.id for m in backend.check()] == ["django_esdlock.W010"]
        backend.setup()
        assert backend.check() == []
        installed = backend.client.ingest.get_pipeline(id=name)[name]
        assert installed["processors"] == pipeline_body()["processors"]
    finally:
        backend.close()


@pytest.mark.parametrize("value", ["Has Spaces", "UPPER", "", 7, "-leading"])
def test_a_bad_pipeline_id_is_refused_before_anything_is_written(es_url, value):
    with pytest.raises(InvalidLockBackend, match="grant_pipeline"):
        load_backend({"BACKEND": ES_BACKEND, "OPTIONS": {"hosts": [es_url], "grant_pipeline": value}})


def test_a_url_may_turn_the_pipeline_off(es_url):
    backend = load_backend({"BACKEND": ES_BACKEND, "OPTIONS": {"hosts": [es_url], "grant_pipeline": "none"}})
    try:
        assert backend.grant_pipeline is None
    finally:
        backend.close()


def test_a_bulk_that_joins_a_known_node_takes_its_fresh_ones_with_the_scripted_upsert(store):
    # Elasticsearch 7.0 fails an upsert through an alias beside a pipelined create: they never share a bulk.
    first, second = load_backend(store), load_backend(store)
    try:
        held = first.acquire(tree(("/a", "IX"), ("/a/b", "X")))
        joined = second.acquire(tree(("/a", "IX"), ("/a/c", "X")))  # learns that /a exists
        sent = recorded(second)
        again = second.acquire(tree(("/a", "IX"), ("/a/d", "X")))
        assert held is not None and joined is not None and again is not None
        ((bulk),) = sent
        assert [(verb, header["_id"]) for verb, header, _ in bulk] == [
            ("update", Node("fs", Kind.TREE, "/a/d").id),
            ("update", Node("fs", Kind.TREE, "/a").id),
        ]
        assert "pipeline" not in str(bulk)
        for grant, backend in ((again, second), (joined, second), (held, first)):
            assert backend.release(grant) is True
        assert first.holders(namespace="fs").holders == []  # /a keeps their entries, which hold nothing
    finally:
        first.close()
        second.close()


def test_a_pipeline_whose_creates_keep_failing_is_given_up(own_pipeline, monkeypatch, caplog):
    # Installed and "ours", yet every create through it fails: after the second, fresh nodes go back to the script.
    failing = {"version": 1, "processors": [{"script": {"lang": "painless", "source": "ctx.x = ctx.missing.length()"}}]}
    monkeypatch.setattr(grants, "pipeline_body", lambda: failing)
    backend = load_backend(own_pipeline)
    try:
        sent = recorded(backend)
        for path in ("/f1", "/f2", "/f3"):
            with caplog.at_level(logging.WARNING, logger="django_esdlock"):
                grant = backend.acquire(tree((path, "X")))
            assert grant is not None
            assert backend.release(grant) is True
        # /f1: the create fails, ACQUIRE takes the node, RELEASE gives it back; /f2: the same, and the pipeline is
        # given up; /f3: the scripted upsert creates it at once, and it is deleted (RELEASE behind the delete).
        assert [[verb for verb, _, _ in bulk] for bulk in sent] == [
            *(["create"], ["update"], ["update"]) * 2,
            ["update"],
            ["delete", "update"],
        ]
        assert backend._pipeline is None and "fail" in backend._pipeline_why
        assert "taken with a scripted upsert" in caplog.text
    finally:
        backend.close()
