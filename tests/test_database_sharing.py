"""The database backend shared by threads and processes: close() under running calls, first uses racing to setup."""

from __future__ import annotations

import os
import tempfile
import threading

import pytest

from .dbstores import db_config, postgres_store
from .peer import setup_django
from .procs import run_processes

CLOSE_ROUNDS = 150
"""close() calls made while another thread keeps calling, per run."""


def _close_under_calls(config: dict) -> int:
    """In a process of its own (a crash must fail the test, not end the run): a thread locks and renews
    without pause while this one closes the backend again and again. Returns the pairs the thread made."""
    setup_django()
    from django_esdlock.conf import load_backend
    from django_esdlock.locks import lock_tree

    backend = load_backend(config)
    stop = threading.Event()
    pairs, failures = [0], []

    def lock_and_renew():
        try:
            while not stop.is_set():
                with lock_tree("/busy", backend=backend, timeout=10) as lock:
                    assert backend.renew(lock.grant)
                pairs[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported to the test
            failures.append(e)

    worker = threading.Thread(target=lock_and_renew)
    worker.start()
    try:
        for _ in range(CLOSE_ROUNDS):
            backend.close()
            threading.Event().wait(0.002)
    finally:
        stop.set()
        worker.join(60)
    assert not worker.is_alive(), "the locking thread hung"
    assert not failures, failures
    backend.close()
    return pairs[0]


def test_close_from_another_thread_waits_for_the_call_on_each_connection(store_config):
    # Before: SQLite died with SIGSEGV (a connection closed under a running
    # statement); psycopg lost its protocol state.
    [pairs] = run_processes(_close_under_calls, [(store_config,)], timeout=180)
    assert pairs > 0


@pytest.fixture(params=["postgres", "sqlite"])
def store_config(request, django_db_blocker):
    if request.param == "postgres":
        with django_db_blocker.unblock(), postgres_store() as config:
            yield config
        return
    with tempfile.TemporaryDirectory(prefix="esdlock-close-") as directory:
        yield db_config("sqlite:///" + os.path.join(directory, "locks.sqlite3"))


def _first_acquire(config: dict, start_at: float) -> int:
    """Wait for the common start, then lock on a store whose tables may not exist yet; return the token."""
    import time

    setup_django()
    from django_esdlock.conf import load_backend
    from django_esdlock.locks import lock_documents

    backend = load_backend(config)
    time.sleep(max(0.0, start_at - time.time()))
    with lock_documents([str(os.getpid())], backend=backend, timeout=30) as lock:
        return lock.token


@pytest.mark.parametrize("round_", range(2))
def test_processes_racing_to_create_the_sqlite_tables_all_get_their_locks(round_):
    import time

    with tempfile.TemporaryDirectory(prefix="esdlock-setup-race-") as directory:
        config = db_config("sqlite:///" + os.path.join(directory, "locks.sqlite3"))
        start_at = time.time() + 5.0  # after the four have started and set Django up
        tokens = run_processes(_first_acquire, [(config, start_at)] * 4, timeout=120)
    assert len(set(tokens)) == 4
