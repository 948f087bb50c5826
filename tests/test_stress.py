"""Multi-process stress: no lost update under locks, lost updates without (so it can fail)."""

from __future__ import annotations

import pytest

from django_esdlock.conf import load_backend

from .contract import all_holders
from .stress import run_stress


@pytest.fixture
def stress_config(store_config):
    return store_config


@pytest.fixture
def control_config(shared_stores):
    """Any one store: the control takes no lock, so which store is configured cannot change its outcome."""
    return shared_stores.get("sqlite")


@pytest.mark.slow
def test_no_lost_update_under_tree_locks(stress_config):
    result = run_stress(stress_config, processes=8, rounds=250)
    assert sum(result.expected) >= 2000
    assert result.actual == result.expected, f"lost {result.lost_updates} updates in {result.seconds:.1f}s"
    assert result.token_violations == 0
    assert all_holders(load_backend(stress_config)) == []


@pytest.mark.slow
def test_control_run_without_locks_loses_updates(control_config):
    result = run_stress(control_config, processes=8, rounds=60, use_locks=False)
    assert result.lost_updates > 0, "the race window is too small to show anything"
