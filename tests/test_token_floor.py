"""Fencing tokens never go backwards: a lost Elasticsearch lock index, a rewound SQL sequence, a token floor."""

from __future__ import annotations

import contextlib
import sqlite3

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured

from django_esdlock import LockLost, lock_tree
from django_esdlock.conf import load_backend
from django_esdlock.modes import Mode
from django_esdlock.reaper import Reaper

from .contract import all_holders, raw_grant
from .dbstores import postgres_store, sqlite_path, sqlite_store, url_of
from .expiry import expire
from .stores import es_store

pytestmark = pytest.mark.django_db


@pytest.fixture
def es_config(es_url):
    with es_store(es_url) as config:
        yield config


def delete_behind(backend) -> list[str]:
    """Delete the lock index as an operator would: its concrete index (an alias cannot be deleted)."""
    names = list(backend.concrete_indices())
    for name in names:
        backend.client.indices.delete(index=name)
    return names


def grant_token(backend, path: str = "/a/b") -> int:
    with lock_tree(path, timeout=5, backend=backend) as lock:
        return lock.token


def strict_incarnation(backend) -> tuple[str, int]:
    """The one concrete index behind the lock index: it has the strict lock mapping; its name and token floor."""
    ((name, alias),) = backend.concrete_indices().items()
    mapping = backend.client.indices.get_mapping(index=alias)[name]["mappings"]
    assert mapping["dynamic"] == "strict" and "django_esdlock" in mapping["_meta"]
    floor = int(name.rpartition(".floor-")[2])
    return name, floor


def test_deleting_the_lock_index_between_two_grants_never_sends_a_token_back(es_config):
    backend = load_backend(es_config)
    try:
        tokens = [grant_token(backend) for _ in range(3)]
        held = lock_tree("/held", backend=backend).acquire()
        before = max(*tokens, held.token)
        deleted = delete_behind(backend)
        after = grant_token(backend)
        assert after > before, (before, after)
        name, floor = strict_incarnation(backend)
        assert name not in deleted and floor >= before  # every token of the new index exceeds every earlier one
        # Listing and reaping work on the new index (a dynamic mapping would make the sorted search a 400).
        with lock_tree("/a/b/c", backend=backend):
            assert {h.node.key for h in all_holders(backend)} == {"/a", "/a/b", "/a/b/c"}
        expire(backend, raw_grant(backend, "/stale", Mode.X, ttl=30).request.holder_id)
        report = Reaper(backend).run()
        assert [r.node.key for r in report.evicted] == ["/stale"]
        assert all_holders(backend) == []
        # The lock held across the loss is gone with its index: its release says so (and stops its renewals).
        with pytest.raises(LockLost):
            held.release()
    finally:
        backend.close()


def test_a_process_that_saw_higher_tokens_replaces_an_index_recreated_below_them(es_config):
    """A process that never saw a token recreates the lost index at floor 0; one that saw higher ones moves it up."""
    seasoned, fresh = load_backend(es_config), load_backend(es_config)
    try:
        last = max(grant_token(seasoned) for _ in range(3))
        delete_behind(seasoned)
        newcomer = grant_token(fresh)  # knows nothing: floor 0 (OPTIONS token_floor), below `last`
        assert strict_incarnation(fresh)[1] == 0 and newcomer < last
        after = grant_token(seasoned)  # finds the index below what it saw: replaces it
        assert after > last
        assert strict_incarnation(seasoned)[1] >= last
        assert grant_token(fresh) > after  # the newcomer follows the alias to the new index
    finally:
        seasoned.close()
        fresh.close()


def test_the_token_floor_option_is_honoured_at_creation_and_by_replacement(es_config):
    floor = 10**15
    plain = load_backend(es_config)
    raised = load_backend({**es_config, "OPTIONS": {**es_config["OPTIONS"], "token_floor": str(floor)}})
    try:
        assert grant_token(plain) < floor
        assert [m.id for m in raised.check()] == ["django_esdlock.W009"]  # the index gives tokens below the floor
        assert grant_token(raised) > floor  # replaced: its first write moves the alias to an index above the floor
        assert strict_incarnation(raised)[1] == floor
        assert raised.check() == []
        assert grant_token(plain) > floor
    finally:
        plain.close()
        raised.close()


def test_every_write_after_the_loss_lands_in_an_index_with_the_strict_mapping(es_config):
    """Acquire, renewal, release and take-over each find the lock index gone: none leaves a dynamic index behind."""
    backend = load_backend(es_config)
    try:
        last = grant_token(backend)
        writes = {
            "renew": (lambda grant, records: backend.renew(grant), False),
            "release": (lambda grant, records: backend.release(grant), False),
            "take over": (
                lambda grant, records: backend.take_over(
                    records, grant.request.owner, ttl=30, recovery=None, require_expired=False
                ),
                None,
            ),
            "acquire": (lambda grant, records: raw_grant(backend, "/x", Mode.X, ttl=30).token > last, True),
        }
        for name, (write, expected) in writes.items():
            grant = raw_grant(backend, "/held", Mode.X, ttl=30)
            records = backend.node_holders(grant.taken[0])
            last = max(last, grant.token)
            delete_behind(backend)
            assert write(grant, records) == expected, name
            strict_incarnation(backend)
            assert backend.check() == []
        # Reads create nothing: reaping a store whose lock index is gone finds nothing to do.
        delete_behind(backend)
        assert Reaper(backend).run().evicted == []
        assert backend.concrete_indices() == {}
    finally:
        backend.close()


# --- SQL stores: a restore rewinds the token counter; the runbook and token_floor move it up again -----


@pytest.fixture(params=["postgres", "sqlite"])
def db_config(request, django_db_blocker):
    store = postgres_store if request.param == "postgres" else sqlite_store
    with django_db_blocker.unblock(), store() as config:
        yield config


def run_sql(config: dict, statement: str, params: tuple = ()) -> None:
    """Run one statement on the lock database, apart from the backend (as an operator or a restore would)."""
    url = url_of(config)
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(sqlite_path(config), timeout=30)) as connection, connection:
            connection.execute(statement, params)
    else:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(statement, params)


def rewind(config: dict) -> None:
    """What restoring an earlier backup (or a point in time) does to the token counter: it goes back."""
    if url_of(config).startswith("sqlite"):
        run_sql(config, "UPDATE esdlock_token SET value = 1")
    else:
        run_sql(config, "SELECT setval('esdlock_token_seq', 1)")


def test_a_rewound_token_counter_is_moved_above_the_floor(db_config, django_db_blocker):
    with django_db_blocker.unblock():
        backend = load_backend(db_config)
        highest = max(grant_token(backend) for _ in range(5))
        rewind(db_config)
        assert grant_token(backend) < highest  # the finding: after a restore, tokens go back
        options = {**db_config["OPTIONS"], "token_floor": highest}
        floored = load_backend({**db_config, "OPTIONS": options})
        assert grant_token(floored) > highest
        assert grant_token(backend) > highest  # one counter: every process gets tokens above the floor now
        again = load_backend({**db_config, "OPTIONS": options})
        before = grant_token(backend)
        assert grant_token(again) > before  # a floor already passed never moves the counter back
        for b in (backend, floored, again):
            b.close()


def test_the_postgres_restore_runbook(django_db_blocker):
    """README, "Restoring a lock store": setval to at least the highest token any client saw."""
    with django_db_blocker.unblock(), postgres_store() as config:
        backend = load_backend(config)
        highest = max(grant_token(backend) for _ in range(5))
        rewind(config)
        run_sql(
            config,
            "SELECT setval('esdlock_token_seq', GREATEST((SELECT last_value FROM esdlock_token_seq), %s))",
            (highest + 1000,),
        )
        assert grant_token(backend) > highest + 1000
        backend.close()


def test_token_floor_in_a_lock_backend_url():
    from django_esdlock.conf import parse_url

    assert parse_url("sqlite:////tmp/locks.sqlite3?token_floor=7&timeout=5")["OPTIONS"] == {
        "url": "sqlite:////tmp/locks.sqlite3?timeout=5",
        "token_floor": "7",
    }
    assert parse_url("elasticsearch://127.0.0.1:9200/locks?token_floor=9")["OPTIONS"]["token_floor"] == "9"
    backend = load_backend("postgres://u@127.0.0.1/db?token_floor=11")
    assert backend.token_floor == 11 and "token_floor" not in backend.url.partition("?")[2]
    with pytest.raises(ImproperlyConfigured, match="token_floor"):
        load_backend("sqlite:////tmp/locks.sqlite3?token_floor=-1")
    with pytest.raises(ImproperlyConfigured, match="token_floor"):
        load_backend("elasticsearch://127.0.0.1:9200/locks?token_floor=x")
