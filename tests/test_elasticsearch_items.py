"""Reading bulk items as a real cluster answers them, including what noida-db never sends."""

from __future__ import annotations

import dataclasses

import pytest

from django_esdlock.backends.elasticsearch.answers import TOKEN_TERM_SHIFT, fresh_node_exists, read_acquire_items
from django_esdlock.modes import Mode
from django_esdlock.records import Kind, LockRequest, Node, Owner

OWNER = Owner("host", 1, 2, "MainThread", "proc")
A, B, C = (Node("fs", Kind.TREE, p) for p in ("/a", "/a/b", "/a/b/c"))


def request(reentrant=False):
    return LockRequest("h1", OWNER, ((A, Mode.IX), (B, Mode.IX), (C, Mode.X)), 30, reentrant=reentrant)


def ok(result, seq_no, **extra):
    return {"update": {"_id": "x", "result": result, "_seq_no": seq_no, "_primary_term": 1, "status": 200, **extra}}


def error(status, kind):
    return {"update": {"_id": "x", "status": status, "error": {"type": kind, "reason": "..."}}}


TERM_1 = 1 << TOKEN_TERM_SHIFT


def test_all_taken_token_is_highest_seq_no_plus_one_under_the_primary_term():
    outcome = read_acquire_items(request(), [ok("created", 7), ok("updated", 9), ok("created", 8)])
    assert outcome.taken == [A, B, C] and not outcome.refused and not outcome.errors
    assert outcome.token == TERM_1 + 10


def test_a_higher_primary_term_wins_over_a_higher_seq_no():
    # An operator forced an empty primary: the sequence starts again, under a higher term.
    before = read_acquire_items(request(), [ok("created", 7), ok("updated", 900), ok("created", 8)])
    after = read_acquire_items(request(), [ok("created", 0, _primary_term=3)] + [ok("updated", 1, _primary_term=3)] * 2)
    assert after.token > before.token


def test_noop_is_a_refusal():
    outcome = read_acquire_items(request(), [ok("updated", 3), ok("updated", 4), ok("noop", 2)])
    assert outcome.taken == [A, B] and outcome.refused == [C]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (409, "version_conflict_engine_exception"),  # concurrent update after retry_on_conflict
        (409, "version_conflict_engine_exception"),  # two upserts racing: "document already exists"
    ],
)
def test_contention_is_a_refusal_never_a_grant(status, kind):
    outcome = read_acquire_items(request(), [ok("created", 1), error(status, kind), ok("created", 2)])
    assert outcome.taken == [A, C] and outcome.refused == [B] and not outcome.errors and not outcome.busy


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, "es_rejected_execution_exception"),  # write queue full
        (429, "circuit_breaking_exception"),  # a memory breaker
        (503, "unavailable_shards_exception"),  # no primary to write to
    ],
)
def test_a_busy_store_is_neither_grant_nor_refusal(status, kind):
    outcome = read_acquire_items(request(), [ok("created", 1), error(status, kind), ok("created", 2)])
    assert outcome.taken == [A, C] and not outcome.refused and not outcome.errors
    assert outcome.busy == [f"{B}: {kind}: ..."]


def test_other_item_errors_are_errors():
    outcome = read_acquire_items(request(), [ok("created", 1), error(400, "script_exception"), ok("created", 2)])
    assert outcome.errors and outcome.taken == [A, C]


def test_a_reentry_is_an_update_with_neither_a_holder_nor_a_marker_of_the_request():
    # ACQUIRE writes a reentered node back unchanged; a no-op is a refusal even where this owner's entry stays
    # (its lease may have ended by the store's clock: the script, not the caller's clock, judges it).
    mine = {"get": {"_source": {"holders": [{"id": "h0", "owner": {"key": OWNER.key}, "mode": "X"}]}}}
    req = LockRequest("h1", OWNER, ((A, Mode.X), (B, Mode.X)), 30, reentrant=True)
    outcome = read_acquire_items(req, [ok("updated", 5, **mine), ok("created", 6)])
    assert outcome.taken == [B] and not outcome.refused and outcome.token == TERM_1 + 7
    outcome = read_acquire_items(req, [ok("noop", 5, **mine), ok("created", 6)])
    assert outcome.refused == [A] and outcome.taken == [B]
    only_b = dataclasses.replace(req, reentered=frozenset({B}))  # A is not one a lock of this thread holds
    outcome = read_acquire_items(only_b, [ok("updated", 5, **mine), ok("created", 6)])
    assert outcome.taken == [A, B]  # an update of A, for a request that may not reenter it, took it
    queued = dataclasses.replace(req, ticket=1)
    marked = {"get": {"_source": {"holders": mine["get"]["_source"]["holders"], "waiters": [{"id": "h1"}]}}}
    took_b = {"get": {"_source": {"holders": [{"id": "h1"}]}}}
    outcome = read_acquire_items(queued, [ok("updated", 5, **marked), ok("created", 6, **took_b)])
    assert outcome.refused == [A] and outcome.taken == [B]  # its marker on A: it queued there


def created(seq_no):
    return {"create": {"_id": "x", "result": "created", "_seq_no": seq_no, "_primary_term": 1, "status": 201}}


def test_a_plain_create_takes_its_node_for_a_waiting_request_too():
    # A create answers no source; it wrote the request's holder, never a marker.
    waiting = dataclasses.replace(request(), ticket=5)
    outcome = read_acquire_items(waiting, [created(3), created(4), created(5)])
    assert outcome.taken == [A, B, C] and not outcome.refused and outcome.token == TERM_1 + 6


@pytest.mark.parametrize(
    ("item", "found"),
    [
        (created(1), None),
        ({"create": {"status": 409, "error": {"type": "version_conflict_engine_exception"}}}, "exists"),
        ({"create": {"status": 400, "error": {"type": "illegal_argument_exception"}}}, "failed"),
        ({"create": {"status": 429, "error": {"type": "es_rejected_execution_exception"}}}, None),
        (ok("noop", 1), "exists"),
        (ok("created", 1), None),
    ],
)
def test_what_the_item_of_a_fresh_node_says_of_it(item, found):
    assert fresh_node_exists(item) == found
