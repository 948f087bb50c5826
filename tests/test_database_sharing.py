"""The database backend shared by threads and processes: close() under running calls, first uses racing to setup."""

from __future__ import annotations

import os
import tempfile
import threading

import pytest

from .dbstores import db_config, postgres_store
from .peer import SPAWN, setup_django
from .procs import run_processes

CLOSE_ROUNDS = 150
"""close() calls made while another thread keeps calling, per run."""


def _close_under_calls(config: dict) -> int:
    """In a process of its own (a crash must fail the test, not end the run): a thread locks and renews
    without pause while this one closes the backend again and again. Returns the pairs the thread made
    while the closes went on (none: the two never overlapped, and the test proved nothing)."""
    setup_django()
    from django_esdlock.conf import load_backend
    from django_esdlock.locks import lock_tree

    backend = load_backend(config)
    stop, first = threading.Event(), threading.Event()
    pairs, failures = [0], []

    def lock_and_renew():
        try:
            while not stop.is_set():
                with lock_tree("/busy", backend=backend, timeout=10) as lock:
                    assert backend.renew(lock.grant)
                pairs[0] += 1
                first.set()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            failures.append(e)
            first.set()

    worker = threading.Thread(target=lock_and_renew)
    worker.start()
    try:
        assert first.wait(60), "the locking thread made no pair in 60 s"
        before, closes = pairs[0], 0
        # At least CLOSE_ROUNDS closes, and on (bounded) until the thread has locked between them.
        while closes < CLOSE_ROUNDS or (pairs[0] - before < 3 and closes < 100 * CLOSE_ROUNDS and not failures):
            backend.close()
            closes += 1
            threading.Event().wait(0.002)  # a breath between closes, for the other thread's calls
        during = pairs[0] - before
    finally:
        stop.set()
        worker.join(60)
    assert not worker.is_alive(), "the locking thread hung"
    assert not failures, failures
    backend.close()
    return during


def test_close_from_another_thread_waits_for_the_call_on_each_connection(store_config):
    # Before: SQLite died with SIGSEGV (a connection closed under a running
    # statement); psycopg lost its protocol state.
    [pairs] = run_processes(_close_under_calls, [(store_config,)], timeout=180)
    assert pairs >= 3, f"the thread locked {pairs} time(s) while close() was called: the two barely overlapped"


@pytest.fixture(params=["postgres", "sqlite"])
def store_config(request, django_db_blocker):
    if request.param == "postgres":
        with django_db_blocker.unblock(), postgres_store() as config:
            yield config
        return
    with tempfile.TemporaryDirectory(prefix="esdlock-close-") as directory:
        yield db_config("sqlite:///" + os.path.join(directory, "locks.sqlite3"))


RACERS = 4


def _first_acquire(config: dict, barrier, inside, peak) -> int:
    """Start with the others, then lock on a store whose tables do not exist yet; return the token.

    Whoever finds the tables missing and sets them up waits there (bounded) for a second one to arrive:
    at least two set up at once, on every run, however the machine schedules the processes.
    """
    import time

    setup_django()
    from django_esdlock.conf import load_backend
    from django_esdlock.locks import lock_documents

    backend = load_backend(config)
    setup = backend.setup

    def racing_setup() -> None:
        with inside.get_lock():
            inside.value += 1
            peak.value = max(peak.value, inside.value)
        try:
            deadline = time.monotonic() + 60
            while peak.value < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            setup()
        finally:
            with inside.get_lock():
                inside.value -= 1

    backend.setup = racing_setup
    barrier.wait(120)
    with lock_documents([str(os.getpid())], backend=backend, timeout=30) as lock:
        return lock.token


@pytest.mark.parametrize("round_", range(2))
def test_processes_racing_to_create_the_sqlite_tables_all_get_their_locks(round_):
    with tempfile.TemporaryDirectory(prefix="esdlock-setup-race-") as directory:
        config = db_config("sqlite:///" + os.path.join(directory, "locks.sqlite3"))
        barrier, inside, peak = SPAWN.Barrier(RACERS), SPAWN.Value("i", 0), SPAWN.Value("i", 0)
        tokens = run_processes(_first_acquire, [(config, barrier, inside, peak)] * RACERS, timeout=180)
    assert peak.value >= 2, f"{peak.value} process(es) set the tables up at once: no race"
    assert len(set(tokens)) == RACERS
