"""The script-free paths of the Elasticsearch backend fall back to the scripts whenever a node changed."""

from __future__ import annotations

import dataclasses
import time

import pytest

from django_esdlock.backends.elasticsearch.maintenance import STALE_MARGIN_S
from django_esdlock.reaper import Reaper
from django_esdlock.records import Kind, Node, Owner

from .expiry import expire
from .stores import es_backend
from .stores import node_source as source
from .stores import tree_request as tree

OWNER = Owner.current()
HOUR_MS = 3_600_000


@pytest.fixture
def backend(es_url):
    with es_backend(es_url) as backend:
        yield backend


def test_uncontended_pair_leaves_nothing_behind(backend):
    grant = backend.acquire(tree(("/a", "IX"), ("/a/b", "X")))
    assert grant is not None and grant.token > 0
    assert [h["id"] for h in source(backend, "/a")["holders"]] == [grant.request.holder_id]
    assert backend.release(grant) is True
    assert source(backend, "/a") is None and source(backend, "/a/b") is None
    assert backend._sole == {}


def test_release_keeps_a_holder_that_joined_after_the_create(backend):
    first = backend.acquire(tree(("/a", "IX"), ("/a/b", "X")))
    second = backend.acquire(tree(("/a", "IX"), ("/a/c", "X")))  # /a exists: ACQUIRE joins it
    assert first is not None and second is not None
    assert second.token > first.token
    # The delete of /a fails on _seq_no: first's entry stays behind there, the other one too.
    assert backend.release(first) is True
    assert [h["id"] for h in source(backend, "/a")["holders"]] == [first.request.holder_id, second.request.holder_id]
    assert source(backend, "/a/b") is None
    assert [(r.node.key, r.holder_id) for r in backend.holders(namespace="fs").holders] == [
        ("/a", second.request.holder_id),
        ("/a/c", second.request.holder_id),
    ]
    assert backend.release(second) is True
    assert backend.holders(namespace="fs").holders == []
    # This process's next write of /a drops what it left there.
    third = backend.acquire(tree(("/a", "IX"), ("/a/d", "X")))
    assert [h["id"] for h in source(backend, "/a")["holders"]] == [third.request.holder_id]
    assert backend.release(third) is True


def test_release_after_renewal_still_deletes_without_a_script(backend):
    grant = backend.acquire(tree(("/r", "X")))
    assert backend.renew(grant) is True
    versions = backend._sole[grant.request.holder_id]
    assert (
        versions[Node("fs", Kind.TREE, "/r").id][0]
        == backend.client.get(index=backend.index, id="tree:fs:/r")["_seq_no"]
    )
    assert backend.release(grant) is True
    assert source(backend, "/r") is None


def test_refused_acquire_gives_back_what_it_created(backend):
    holder = backend.acquire(tree(("/x", "X")))
    assert backend.acquire(tree(("/y", "IX"), ("/x", "IX"))) is None
    assert source(backend, "/y") is None
    assert backend.release(holder) is True


def _write(backend, key, holders):
    document = {"namespace": "fs", "kind": "tree", "key": key, "parent": None, "depth": 1, "holders": holders}
    backend.client.index(index=backend.index, id=Node("fs", Kind.TREE, key).id, document=document, refresh=True)


def _holder(holder_id, expires_at, **extra):
    return {
        "id": holder_id,
        "mode": "X",
        "owner": OWNER.as_dict(),
        "acquired_at": expires_at - 1,
        "expires_at": expires_at,
        **extra,
    }


def test_reaper_deletes_long_expired_nodes_and_spares_intents_and_live_holders(backend):
    now_ms = int(time.time() * 1000)
    long_ago = now_ms - HOUR_MS
    _write(backend, "/stale", [_holder("s1", long_ago), _holder("s2", long_ago)])
    _write(backend, "/intent", [_holder("i1", long_ago, intent={"op": "nothing-handles-this"})])
    _write(backend, "/mixed", [_holder("m1", long_ago), _holder("m2", now_ms + HOUR_MS)])
    # Within the margin (EVICT's call), and ended well before the store's cached clock (it lags up to 200 ms).
    _write(backend, "/recent", [_holder("r1", now_ms - 1000)])
    assert STALE_MARGIN_S >= 1
    evicted = backend.evict_expired(namespace="fs")
    assert sorted(r.holder_id for r in evicted) == ["m1", "r1", "s1", "s2"]
    assert source(backend, "/stale") is None and source(backend, "/recent") is None
    assert [h["id"] for h in source(backend, "/intent")["holders"]] == ["i1"]
    assert [h["id"] for h in source(backend, "/mixed")["holders"]] == ["m2"]
    assert Reaper(backend, namespace="fs").run().evicted == []


def seq_no(backend, key):
    return backend.client.get(index=backend.index, id=Node("fs", Kind.TREE, key).id)["_seq_no"]


def waiting(*targets, ticket=1):
    return dataclasses.replace(tree(*targets), ticket=ticket)


def test_a_waiting_request_polls_the_node_that_refused_it_alone_and_writes_nothing(backend):
    # A marker's lease grows to 8 answer times on a slow store (a poll then renews it): keep it the setting's.
    backend.marker_ttl = 60
    held = backend.acquire(tree(("/a", "IX"), ("/a/b", "X")))
    request = waiting(("/a", "IX"), ("/a/b", "X"))
    assert backend.acquire(request) is None  # refused at /a/b: leaves its marker there
    assert [w["id"] for w in source(backend, "/a/b")["waiters"]] == [request.holder_id]
    before = seq_no(backend, "/a"), seq_no(backend, "/a/b")
    for _ in range(3):
        assert backend.acquire(request) is None
    # /a/b's marker is fresh: no write; /a was not even tried (nothing taken to give back).
    assert (seq_no(backend, "/a"), seq_no(backend, "/a/b")) == before
    assert backend.release(held) is True
    grant = backend.acquire(request)  # /a/b first, alone, then the rest
    assert grant is not None and {n.key for n in grant.taken} == {"/a", "/a/b"}
    # No marker left; held's release left its tombstone (a node that stays keeps one).
    assert [w["id"] for w in source(backend, "/a/b")["waiters"]] == [held.request.holder_id]
    assert source(backend, "/a/b")["waiters"][0]["released"] is True
    assert backend.release(grant) is True


def test_a_waiting_marker_is_renewed_past_half_its_lease(backend):
    backend.marker_ttl = 60
    held = backend.acquire(tree(("/a", "X")))
    request = waiting(("/a", "X"))
    assert backend.acquire(request) is None
    first = source(backend, "/a")["waiters"][0]["expires_at"]
    before = seq_no(backend, "/a")
    assert backend.acquire(request) is None
    assert seq_no(backend, "/a") == before  # more than half its lease left: the poll writes nothing
    expire(backend, request.holder_id, holders=False, markers=True, by=40)  # 20 s of 60 left
    aged = source(backend, "/a")["waiters"][0]["expires_at"]
    assert backend.acquire(request) is None
    renewed = source(backend, "/a")["waiters"][0]["expires_at"]
    assert renewed > aged and renewed >= first  # a whole new lease
    backend.withdraw(request)
    assert source(backend, "/a")["waiters"] == []
    assert backend.release(held) is True


def test_a_waiting_request_refused_on_every_node_polls_them_all_at_once(backend):
    held = backend.acquire(tree(("/a", "X")))
    request = waiting(("/a", "X"))
    assert backend.acquire(request) is None
    assert backend.acquire(request) is None  # nothing but the probe to send
    assert backend.release(held) is True
    grant = backend.acquire(request)
    assert grant is not None and backend.release(grant) is True


def test_a_release_someone_waited_for_is_still_one_bulk(backend):
    held = backend.acquire(tree(("/m", "X")))
    request = waiting(("/m", "X"))
    assert backend.acquire(request) is None  # its marker on /m makes held's delete of /m fail
    bulks = []
    perform = backend.perform

    def recording(call):
        answer = perform(call)
        if call.name == "bulk":
            bulks.append([(next(iter(item)), next(iter(item.values())).get("result")) for item in answer["items"]])
        return answer

    backend.perform = recording
    assert backend.release(held) is True
    # The delete fails on its _seq_no; the RELEASE behind it, in the same bulk, releases (the marker keeps /m).
    assert bulks == [[("delete", None), ("update", "updated")]]
    assert [w["id"] for w in source(backend, "/m")["waiters"]] == [request.holder_id, held.request.holder_id]
    grant = backend.acquire(request)
    assert grant is not None
    bulks.clear()
    assert backend.release(grant) is True  # not its creation: RELEASE alone, which deletes the emptied node
    assert bulks == [[("update", "deleted")]]
    assert source(backend, "/m") is None
