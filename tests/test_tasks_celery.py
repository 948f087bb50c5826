"""``@locked`` Celery tasks on a real worker process (kombu's filesystem transport: no broker), on PostgreSQL.

One worker (``--pool=solo``: the task runs in the process the test kills)
serves the module; a worker that dies fails the waiting test at once with its
log, and the worker is always stopped.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_esdlock import lock_tree

from . import handlers  # noqa: F401  (registers the test recovery handlers)
from .contract import all_holders
from .dbstores import postgres_store
from .leases import backdate

ROOT = Path(__file__).resolve().parent.parent


class Worker:
    """A ``celery worker`` subprocess; started again by :meth:`ensure` after a test killed it."""

    def __init__(self, directory: Path, config: dict) -> None:
        self.directory = directory
        self.config = config
        self.log = directory / "worker.log"
        self.process: subprocess.Popen | None = None

    def ensure(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        env = {
            **os.environ,
            "ESDLOCK_CELERY_DIR": str(self.directory),
            "ESDLOCK_CELERY_LOCK_BACKEND": json.dumps(self.config),
            "PYTHONPATH": str(ROOT),
        }
        command = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", "--pool=solo"]
        command += ["--without-gossip", "--without-mingle", "--without-heartbeat", "-Q", "esdlock-tests", "-l", "info"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def check(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the celery worker exited with {self.process.returncode}:\n{self.tail()}")

    def tail(self, size: int | None = 4000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-size:] if size else text

    def retries_of(self, task_id: str) -> int:
        """How many times the worker logged a retry of task ``task_id`` (Celery logs each at INFO)."""
        return sum(1 for line in self.tail(None).splitlines() if f"[{task_id}] retry:" in line)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def result(self, async_result, timeout: float = 30):
        """The task's return value; its exception raised; the worker's death or silence fails the test."""
        deadline = time.monotonic() + timeout
        while not async_result.ready():
            self.check()
            assert time.monotonic() < deadline, f"no result within {timeout}s; worker log:\n{self.tail()}"
            time.sleep(0.05)
        return async_result.get(timeout=5)


@pytest.fixture(scope="module")
def celery_store(django_db_blocker):
    with django_db_blocker.unblock(), postgres_store() as config:
        yield config


@pytest.fixture(scope="module")
def module_worker(celery_store, tmp_path_factory):
    from .celery_app import configure

    directory = tmp_path_factory.mktemp("celery")
    configure(str(directory))
    worker = Worker(directory, celery_store)
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture
def worker(module_worker, settings, django_db_blocker):
    module_worker.ensure()
    settings.LOCK_BACKEND = module_worker.config
    with django_db_blocker.unblock():
        yield module_worker


def holders(config) -> list:
    from django_esdlock.conf import load_backend

    backend = load_backend(config)
    try:
        return all_holders(backend)
    finally:
        backend.close()


def test_a_locked_task_runs_under_its_lock_and_gives_it_back(worker, tmp_path):
    from .celery_app import locked_append

    out = tmp_path / "runs.jsonl"
    token = worker.result(locked_append.delay("/celery/a", str(out)), timeout=60)  # the first waits for startup
    (run,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert run["token"] == token and run["pid"] == worker.process.pid
    assert holders(worker.config) == []


def test_a_task_that_cannot_get_its_lock_is_retried_by_celery(worker, tmp_path):
    from .celery_app import retried_append

    out = tmp_path / "runs.jsonl"
    with lock_tree("/celery/busy", namespace="celery") as held:
        held_token = held.token
        result = retried_append.delay("/celery/busy", str(out))
        # The worker tries, gets LockUnavailable, and Celery retries it: seen in the worker's own log.
        deadline = time.monotonic() + 60
        while (retries := worker.retries_of(result.id)) < 2:
            worker.check()
            assert result.state != "FAILURE", f"the task failed instead of being retried:\n{worker.tail()}"
            assert time.monotonic() < deadline, f"{retries} retries within 60s; worker log:\n{worker.tail()}"
            time.sleep(0.05)
        assert not out.exists(), "the task body ran while the lock was held elsewhere"
    outcome = worker.result(result)
    assert outcome["token"] > held_token and outcome["retries"] >= retries, outcome
    assert holders(worker.config) == []


def test_a_view_hands_its_lock_to_the_worker(worker, tmp_path):
    from .celery_app import resumed_append

    out = tmp_path / "runs.jsonl"
    with lock_tree("/celery/doc", namespace="celery") as view:
        view.checkpoint({"done": 2})
        view_token, view_holder = view.token, view.holder_id
        result = resumed_append.delay("/celery/doc", str(out), ticket=view.handoff(ttl=30))
    outcome = worker.result(result)
    assert outcome == {"token": outcome["token"], "checkpoint": {"done": 2}, "holder": view_holder}
    assert outcome["token"] > view_token
    assert holders(worker.config) == []


def test_a_worker_killed_mid_task_is_recovered_by_the_reaper(worker, tmp_path):
    from .celery_app import stuck_change

    out, started = tmp_path / "recovered.jsonl", tmp_path / "started.jsonl"
    stuck_change.delay("/celery/dir", str(out), str(started))
    deadline = time.monotonic() + 60
    while not started.exists():
        worker.check()
        assert time.monotonic() < deadline, f"the task did not start; worker log:\n{worker.tail()}"
        time.sleep(0.05)
    (run,) = [json.loads(line) for line in started.read_text().splitlines()]
    worker.kill()
    backdate(worker.config, run["holder"])  # the dead task's lease ran out; its intent keeps the lock
    report = io.StringIO()
    with override_settings(LOCK_BACKEND=worker.config):
        call_command("reap_locks", "--json", stdout=report)
    assert json.loads(report.getvalue())["counts"]["recovered"] == 1
    (recovered,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert recovered["checkpoint"] == {"done": 1} and recovered["token"] > run["token"]
    assert holders(worker.config) == []
