"""lock_check's final reap waits for every lease it finds, the reaper's own recoveries' too."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest

from django_esdlock.checker.run import _until_expired


def held(seconds_left: float) -> SimpleNamespace:
    return SimpleNamespace(expires_at=datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_left))


def test_at_least_the_runs_lease_when_every_lease_already_ended():
    assert _until_expired([held(-5)], ttl=1.0, backend_ttl=30.0) == pytest.approx(1.2)


def test_a_recovery_holding_for_the_backends_lease_is_waited_for():
    # A recovery whose release the store failed (a failover then): it holds for the backend's lease.
    assert _until_expired([held(0.5), held(12)], ttl=1.0, backend_ttl=30.0) == pytest.approx(12.2, abs=0.05)


def test_never_longer_than_the_longest_lease():
    # A clock far off cannot make the run wait past the longest lease a holder may have.
    assert _until_expired([held(500)], ttl=1.0, backend_ttl=30.0) == pytest.approx(30.2)
