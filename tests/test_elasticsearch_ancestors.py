"""Shared ancestors on Elasticsearch: a release leaves its IS/IX entry there, and nobody is held back by it.

The rules (see "Ancestors" in the protocol module): a release writes its
main node and the ancestors it alone wrote, not the ancestors it shares; an
entry left behind names its main node, where anyone it refuses reads whether
it still holds, and asks again with it as ``gone``; this process's next write
of that ancestor drops what it left there; an entry is written only after its
main node was taken (deepest first, and again behind a main node taken in a
later ``_bulk``), and a ``gone`` entry is dropped only as it was read.
"""

from __future__ import annotations

import threading
import time

import pytest

from django_esdlock import lock_tree
from django_esdlock.backends.elasticsearch.protocol import bottom_up, gone_entry
from django_esdlock.conf import load_backend
from django_esdlock.records import Kind, Node
from django_esdlock.steps import drive

from .stores import es_store, recorded_bulks
from .stores import node_source as source
from .stores import tree_request as tree


@pytest.fixture
def config(es_url):
    with es_store(es_url) as config:
        yield config


@pytest.fixture
def backends(config):
    """Three backends on one lock index: three processes, as far as what each remembers goes."""
    made = [load_backend(config) for _ in range(3)]
    made[0].setup()
    yield made
    for backend in made:
        backend.close()


def ids(bulk):
    """A recorded ``_bulk`` as (verb, node id) pairs."""
    return [(verb, header["_id"]) for verb, header, _ in bulk]


def node_id(path):
    return Node("fs", Kind.TREE, path).id


def test_a_release_writes_no_ancestor_it_shares(backends):
    first, second, _ = backends
    one = first.acquire(tree(("/t", "IX"), ("/t/x", "X")))
    other = second.acquire(tree(("/t", "IX"), ("/t/y", "X")))
    sent = recorded_bulks(second)
    assert second.release(other) is True
    (release,) = sent
    assert {node for _, node in ids(release)} == {node_id("/t/y")}  # /t is not written
    assert sorted(h["id"] for h in source(first, "/t")["holders"]) == sorted(
        [one.request.holder_id, other.request.holder_id]
    )
    # It holds nothing: neither the listing nor the waiting state shows it.
    assert [(r.node.key, r.holder_id) for r in first.holders(namespace="fs").holders] == [
        ("/t", one.request.holder_id),
        ("/t/x", one.request.holder_id),
    ]
    assert [r.holder_id for r in first.node_holders(Node("fs", Kind.TREE, "/t"))] == [one.request.holder_id]
    assert first.holder_records(other.request.holder_id) == []
    assert first.release(one) is True


def test_an_ancestor_is_granted_at_once_when_its_last_descendant_lets_go(backends):
    first, second, third = backends
    one = first.acquire(tree(("/t", "IX"), ("/t/x", "X")))
    other = second.acquire(tree(("/t", "IX"), ("/t/y", "X")))
    assert third.acquire(tree(("/t", "X"))) is None  # both hold
    assert first.release(one) is True
    assert third.acquire(tree(("/t", "X"))) is None  # one's entry is shown gone, other's is not
    assert second.release(other) is True
    taken = third.acquire(tree(("/t", "X")))  # both shown gone on their main nodes: no wait, no lease to run out
    assert taken is not None
    assert [h["id"] for h in source(third, "/t")["holders"]] == [taken.request.holder_id]
    assert first.acquire(tree(("/t", "IX"), ("/t/z", "X"))) is None  # and it excludes the subtree as ever
    assert third.release(taken) is True


def test_a_waiting_exclusive_request_is_granted_soon_after_the_descendant_lets_go(config, backends):
    first, _, _ = backends
    one = first.acquire(tree(("/w", "IX"), ("/w/x", "X")))
    other = first.acquire(tree(("/w", "IX"), ("/w/y", "X")))
    granted = {}

    def wait():
        started = time.monotonic()
        with lock_tree("/w", namespace="fs", timeout=20, backend=load_backend(config)) as lock:
            granted["after"] = time.monotonic() - started
            granted["token"] = lock.token

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    assert first.release(one) is True
    time.sleep(0.5)
    assert "after" not in granted  # other still holds
    released = time.monotonic()
    assert first.release(other) is True
    waiter.join(timeout=20)
    assert not waiter.is_alive() and granted["token"] > other.token
    assert granted["after"] < 1.0 + 0.5 + (time.monotonic() - released)  # not a lease (30 s) later


def test_this_processes_next_write_drops_what_it_left(backends):
    first, _, _ = backends
    anchor = first.acquire(tree(("/o", "IX"), ("/o/keep", "X")))  # /o stays shared
    for leaf in ("/o/a", "/o/b", "/o/c", "/o/d"):
        grant = first.acquire(tree(("/o", "IX"), (leaf, "X")))
        assert first.release(grant) is True
        ids = [h["id"] for h in source(first, "/o")["holders"]]
        assert ids == [anchor.request.holder_id, grant.request.holder_id]  # only the latest stays behind
    assert first.release(anchor) is True


def test_an_ancestor_taken_before_its_main_node_is_written_again_behind_it(backends):
    first, second, _ = backends
    # /r/m exists (first holds S below it, so IS there): second's S on /r/m finds it with its create and takes
    # it with ACQUIRE in a second _bulk; /r, created in the first, goes again behind it.
    below = first.acquire(tree(("/r", "IS"), ("/r/m", "IS"), ("/r/m/n", "S")))
    sent = recorded_bulks(second)
    shared = second.acquire(tree(("/q", "IS"), ("/q/m", "S")))  # learns nothing of /r: a fresh run
    assert shared is not None and second.release(shared) is True
    sent.clear()
    second._existing.clear()
    taken = second.acquire(tree(("/r", "IS"), ("/r/m", "S")))
    assert taken is not None
    creates, again = sent
    assert ids(creates) == [("create", node_id("/r/m")), ("create", node_id("/r"))]
    assert ids(again) == [("update", node_id("/r/m")), ("update", node_id("/r"))]
    assert second.release(taken) is True and first.release(below) is True


def acquire_directly(backend, request, batch=None, gone=None):
    """Send ACQUIRE for ``batch`` (default: every node) of ``request`` in one ``_bulk``, with ``gone``; its items."""
    holder = {"id": request.holder_id, "owner": request.owner.as_dict()}
    operations = backend._acquire_items(list(batch or request.targets), holder, request, gone)
    return drive(backend._bulk_steps(operations, "acquire"), backend.perform)


def entry_of(backend, path, holder_id):
    (entry,) = [h for h in source(backend, path)["holders"] if h["id"] == holder_id]
    return entry


def test_a_gone_entry_is_dropped_only_as_it_was_read(backends):
    first, second, _ = backends
    request = tree(("/g", "IX"), ("/g/m", "X"))
    ancestor = request.targets[:1]
    (item,) = acquire_directly(first, request, ancestor)  # the ancestor alone, as a probe takes it
    assert item["update"]["result"] == "created"
    entry = entry_of(first, "/g", request.holder_id)
    assert entry["main"] == node_id("/g/m")
    # Written again (as behind a main node taken later): another write, even within one millisecond.
    acquire_directly(first, request, ancestor)
    rewritten = entry_of(first, "/g", request.holder_id)
    assert rewritten["write"] != entry["write"]
    exclusive = tree(("/g", "X"))
    as_read = {node_id("/g"): [gone_entry(entry)]}
    (refused,) = acquire_directly(second, exclusive, gone=as_read)  # the entry read then is not this one
    assert refused["update"]["result"] == "noop"
    # A holder taken over keeps its id, not its owner: a gone entry of another owner is not this one either.
    as_if_taken_over = {node_id("/g"): [[request.holder_id, None, "another owner"]]}
    (refused,) = acquire_directly(second, exclusive, gone=as_if_taken_over)
    assert refused["update"]["result"] == "noop"
    as_now = {node_id("/g"): [gone_entry(rewritten)]}
    (granted,) = acquire_directly(second, exclusive, gone=as_now)
    assert granted["update"]["result"] == "updated"
    assert [h["id"] for h in source(first, "/g")["holders"]] == [exclusive.holder_id]


def test_a_listing_page_is_filled_with_nodes_that_hold(backends):
    first, second, third = backends
    grants = [first.acquire(tree(("/s", "IX"), ("/s/k", "X"))), second.acquire(tree(("/s", "IX"), ("/s/m", "X")))]
    assert first.release(grants[0]) is True and second.release(grants[1]) is True
    assert len(source(first, "/s")["holders"]) == 2  # left behind by both: /s shows nobody
    held = third.acquire(tree(("/u", "X")))
    page = third.holders(namespace="fs", limit=1)  # "/s" sorts first: the page reads on to "/u"
    assert [(r.node.key, r.holder_id) for r in page.holders] == [("/u", held.request.holder_id)]
    assert third.holders(namespace="fs", limit=1, cursor=page.next_cursor).holders == []
    assert third.release(held) is True


def test_an_entry_given_back_and_written_again_is_not_the_entry_read(backends):
    """A rewrite after a give-back is another write, even within the millisecond the store's clock stamps.

    (7.0's ``ctx._now`` is a clock cached for up to 200 ms.) A refused
    request took its ancestor and gave it back; someone it refused read the
    entry, with no holder on its main node; the request, granted later,
    wrote the entry again: the entry read then must not drop this one.
    """
    first, second, _ = backends
    request = tree(("/h", "IX"), ("/h/m", "X"))
    ancestor = request.targets[0][0]
    acquire_directly(first, request, request.targets[:1])  # the ancestor, taken while its main node refused
    read = entry_of(first, "/h", request.holder_id)
    drive(first._release_steps(request.holder_id, request.owner.key, [ancestor], quiet=True), first.perform)
    assert source(first, "/h") is None  # given back
    acquire_directly(first, request, bottom_up(request.targets))  # granted: its main node, then the ancestor
    assert entry_of(first, "/h/m", request.holder_id) and entry_of(first, "/h", request.holder_id)
    exclusive = tree(("/h", "X"))
    as_read = {ancestor.id: [gone_entry(read)]}
    (refused,) = acquire_directly(second, exclusive, gone=as_read)
    assert refused["update"]["result"] == "noop"
