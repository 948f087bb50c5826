"""A holder frozen past its lease (SIGSTOP) and thawed after a new holder wrote is refused by the data's store.

The lease cannot stop it: its process was stopped after checking its lock,
so it writes with the token it holds. The rows (PostgreSQL, SQLite) and the
documents (Elasticsearch) refuse that write with StaleFence, and keep the
new holder's value. Every wait is bounded; a dead worker fails the test at
once with its traceback (``tests/procs.py``).
"""

from __future__ import annotations

import os
import uuid

import pytest

from django_esdlock import StaleFence, lock_tree
from django_esdlock.conf import load_backend
from django_esdlock.fencing import fenced_update, fenced_update_document
from tests.contract import store_params
from tests.peer import SPAWN, setup_django
from tests.procs import frozen, spawned
from tests.stores import es_store

PATH = "/accounts/frozen"
WAIT = 60.0
"""Seconds any step of these tests may take before it fails the test."""


def _write_row(data: dict, lock_or_token, note: str) -> None:
    from tests.fencing_app.models import Account

    fenced_update(Account.objects.using(data["alias"]).filter(name="frozen"), lock_or_token, note=note)


def _write_document(data: dict, lock_or_token, note: str) -> None:
    from elasticsearch import Elasticsearch

    with Elasticsearch(data["url"]) as client:
        fenced_update_document(client, data["index"], "frozen", {"note": note}, lock_or_token, refresh=True)


def frozen_holder(lock_config: dict, data: dict, ready, go) -> dict:
    """Take the lock (short lease), write, check it, say ready and wait to be frozen and thawed; then write again.

    Return how the store answered the write with the raw token, and the write with the (lost) lock.
    """
    setup_django()
    if data["kind"] != "elasticsearch":
        from django.db import connections

        connections.settings[data["alias"]]["NAME"] = data["name"]  # the test database, not the configured one
    from tests.fencing_app.models import NAMESPACE

    write = _write_document if data["kind"] == "elasticsearch" else _write_row
    lock = lock_tree(PATH, namespace=NAMESPACE, ttl=data["ttl"], backend=load_backend(lock_config)).acquire()
    write(data, lock, "first holder")
    token = lock.token
    lock.check()  # ... and here the process is paused, its lock checked, its write about to go
    ready.put(os.getpid())
    if not go.wait(WAIT):
        raise TimeoutError("never thawed")
    outcome = {"token": token}
    try:
        write(data, token, "stale holder")
        outcome["raw"] = "written"
    except StaleFence as e:
        outcome["raw"] = {"error": "StaleFence", "token": e.token, "newer": e.newer}
    try:
        write(data, lock, "stale holder, lock checked")
        outcome["lock"] = "written"
    except Exception as e:  # noqa: BLE001 - its class is the outcome
        outcome["lock"] = type(e).__name__
    lock.abandon()
    return outcome


def run_frozen_holder(lock_config: dict, data: dict, write, read) -> tuple[dict, int]:
    """Freeze the holder, let a new holder take the lock once the store evicts it and write; thaw it.

    Return the frozen holder's outcome and the new holder's token; ``read()`` is checked to hold its value.
    """
    from tests.fencing_app.models import NAMESPACE

    ready, go = SPAWN.Queue(), SPAWN.Event()
    with spawned(frozen_holder, [(lock_config, data, ready, go)]) as workers:
        pid = workers.receive(ready, "the holder was not ready", WAIT)
        with frozen(pid, WAIT):
            assert read() == "first holder"
            backend = load_backend(lock_config)
            try:
                # Granted once the store's clock says the frozen holder's lease ran out: no guessed sleep.
                with lock_tree(PATH, namespace=NAMESPACE, timeout=WAIT, backend=backend) as lock:
                    write(data, lock, "new holder")
                    new_token = lock.token
            finally:
                backend.close()
        go.set()
        (outcome,) = workers.results(WAIT)
    assert read() == "new holder"
    return outcome, new_token


def _check(outcome: dict, new_token: int) -> None:
    assert new_token > outcome["token"]
    assert outcome["raw"] == {"error": "StaleFence", "token": outcome["token"], "newer": new_token}
    assert outcome["lock"] in ("LockLost", "StaleFence")  # lost by its lease, or refused by the store


@pytest.mark.django_db(databases=["default", "postgres"], transaction=True)
@pytest.mark.parametrize("kind", store_params("postgres", "sqlite"))
def test_frozen_holder_is_refused_by_the_rows(kind, shared_stores, django_db_blocker):
    from django.db import connections

    from tests.fencing_app.models import Account

    alias = "postgres" if kind == "postgres" else "default"
    Account.objects.using(alias).create(name="frozen")
    data = {"kind": kind, "alias": alias, "name": connections[alias].settings_dict["NAME"], "ttl": 1.0}

    def read() -> str:
        return Account.objects.using(alias).get(name="frozen").note

    with django_db_blocker.unblock():
        outcome, new_token = run_frozen_holder(shared_stores.get(kind), data, _write_row, read)
    _check(outcome, new_token)
    assert Account.objects.using(alias).get(name="frozen").fence == new_token


@pytest.mark.elasticsearch
def test_frozen_holder_is_refused_by_the_documents(es_url):
    from elasticsearch import Elasticsearch

    index = f"test-fenced-{uuid.uuid4().hex[:12]}"
    data = {"kind": "elasticsearch", "url": es_url, "index": index, "ttl": 2.0}
    with Elasticsearch(es_url) as client, es_store(es_url) as lock_config:
        client.indices.create(index=index, mappings={"properties": {"fence": {"type": "long"}}})
        try:
            client.index(index=index, id="frozen", document={"note": "", "fence": 0}, refresh=True)

            def read() -> str:
                return client.get(index=index, id="frozen")["_source"]["note"]

            outcome, new_token = run_frozen_holder(lock_config, data, _write_document, read)
            _check(outcome, new_token)
            assert client.get(index=index, id="frozen")["_source"]["fence"] == new_token
        finally:
            client.indices.delete(index=index)
