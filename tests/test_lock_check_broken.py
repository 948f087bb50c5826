"""lock_check can fail: deliberately broken backends, each caught by the claim it breaks.

The backends are SQLite stores with one flaw each; the spawned workers load
them by dotted path (this module).
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from django_esdlock.backends.database import DatabaseLockBackend
from django_esdlock.checker import CheckOptions, run_check

from .dbstores import sqlite_store

HERE = __name__

# Multi-process runs, like the stress tests: ./runtests runs them, tox leaves them out.
pytestmark = pytest.mark.slow


class NoConflictBackend(DatabaseLockBackend):
    """Skips the conflict check: each request locks private copies of its nodes."""

    def acquire(self, request):
        suffix = "~" + request.holder_id[:8]
        private = tuple((dataclasses.replace(node, key=node.key + suffix), mode) for node, mode in request.targets)
        return super().acquire(dataclasses.replace(request, targets=private))


class SilentRenewalBackend(DatabaseLockBackend):
    """Its renewals renew nothing and report success: a lease runs out and the holder is never told."""

    def renew(self, grant, *, checkpoint=None, recovery=None, timeout=None):
        return True

    def renew_many(self, grants, *, timeout=None):
        return [True] * len(grants)


class BackwardTokenBackend(DatabaseLockBackend):
    """Hands out fencing tokens that decrease."""

    def acquire(self, request):
        grant = super().acquire(request)
        return grant and dataclasses.replace(grant, token=10**9 - grant.token)


class SlowAcquireBackend(DatabaseLockBackend):
    """Every fifth acquire hangs for 1.5 s, whatever the caller's timeout."""

    calls = 0

    def acquire(self, request):
        type(self).calls += 1
        if type(self).calls % 5 == 0:
            time.sleep(1.5)
        return super().acquire(request)


class LeakyBackend(DatabaseLockBackend):
    """Releases nothing and reaps nothing."""

    def release(self, grant):
        return True

    def evict_expired(self, **kwargs):
        return []


class IntentDroppingBackend(DatabaseLockBackend):
    """Stores holders without their intent: a dead holder's change is evicted, never recovered."""

    def acquire(self, request):
        return super().acquire(dataclasses.replace(request, intent=None))


@pytest.fixture
def broken(django_db_blocker):
    """Return ``run(name, **options)``: a lock_check run on a fresh SQLite store through backend ``name``."""

    def run(name, **options):
        with django_db_blocker.unblock(), sqlite_store() as config:
            config = {**config, "BACKEND": f"{HERE}.{name}"}
            return run_check(config, CheckOptions(**{"processes": 3, "seconds": 1.5, "ttl": 1.0, **options}))

    return run


def checks_of(result):
    return {v.check for v in result.violations}


def test_overlapping_grants_are_caught(broken):
    result = broken("NoConflictBackend", faults=(), hold=0.6, seed=1)
    assert "a" in checks_of(result), result.report()
    overlap = next(v for v in result.violations if v.check == "a")
    assert {"invoke", "ok"} <= {e["type"] for e in overlap.events}
    assert len(overlap.events) <= 12


def test_a_lease_lost_without_telling_the_holder_is_caught(broken):
    result = broken("SilentRenewalBackend", faults=(), seconds=3, processes=4, ttl=0.3, hold=1.0, seed=2)
    # Its checkpoints are silently dropped too, which (e) may see as well.
    assert "a" in checks_of(result) and checks_of(result) <= {"a", "e"}, result.report()


def test_fencing_tokens_out_of_order_are_caught(broken):
    result = broken("BackwardTokenBackend", faults=(), processes=2, seed=3)
    assert "b" in checks_of(result), result.report()


def test_a_request_that_outlives_its_timeout_is_caught(broken):
    result = broken("SlowAcquireBackend", faults=(), processes=2, ttl=0.5, slack=0.3, seed=4)
    assert checks_of(result) == {"c"}, result.report()
    assert any("took" in v.message for v in result.violations)


def test_locks_left_held_are_caught(broken):
    result = broken("LeakyBackend", faults=(), processes=2, ttl=0.5, seed=5)
    assert "d" in checks_of(result), result.report()


def test_a_lost_intent_is_caught(broken):
    result = broken("IntentDroppingBackend", faults=("kill",), seconds=2.5, processes=4, ttl=0.5, seed=6)
    assert result.summary["faults"]["kill"] >= 2
    assert checks_of(result) == {"e"}, result.report()


class NoLimitBackend(DatabaseLockBackend):
    """Forgets a semaphore's limit: every request for it is granted, as to shared holders."""

    def acquire(self, request):
        return super().acquire(dataclasses.replace(request, holder_limit=None))


def test_more_semaphore_holders_than_its_limit_are_caught(broken):
    result = broken("NoLimitBackend", faults=(), seconds=2, processes=5, hold=0.8, semaphores=0.8, seed=7)
    assert checks_of(result) == {"a"}, result.report()
    assert all("of limit 2" in v.message for v in result.violations)
