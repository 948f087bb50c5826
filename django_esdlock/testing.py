"""A pytest plugin: run lock_check against your lock store from your own test suite.

Enable it in a ``conftest.py`` and call the ``lock_check`` fixture::

    pytest_plugins = ["django_esdlock.testing"]

    def test_locks_exclude_under_faults(lock_check):
        result = lock_check(seconds=5, processes=3)  # settings.LOCK_BACKEND, every applicable fault
        assert result.ok, result.report()

The workers are real processes started with ``DJANGO_SETTINGS_MODULE``; they
lock a throwaway namespace only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from .checker import CheckOptions, CheckResult, run_check
from .checker.checker import DEFAULT_SLACK
from .checker.failover import DEFAULT_KILL
from .checker.faults import FAULTS

__all__ = ["assert_no_violations", "lock_check"]


def assert_no_violations(result: CheckResult) -> None:
    """Fail with the summary and each violation's slice of history unless the run found none."""
    if not result.ok:
        raise AssertionError(result.report())


@pytest.fixture
def lock_check(request: pytest.FixtureRequest) -> Callable[..., CheckResult]:
    """Return ``run(config=None, *, seconds=5, processes=3, faults=all, ttl=1, seed=None, slack=10, hold=None, ...)``.

    ``config`` is a LOCK_BACKEND value (dict or URL); None uses the setting.
    ``failover_restart`` (and ``failover_kill``) tell the failover fault how
    to start (and kill) an Elasticsearch node, ``store_restart`` how to restart
    the store, ``store_failover`` how to fail it over to a standby, ``guarded`` the guarded-data mode: see
    ``lock_check --help``.
    Under pytest-django, database access is unblocked for the run.
    """

    def run(
        config: Any = None,
        *,
        seconds: float = 5.0,
        processes: int = 3,
        faults: Sequence[str] = FAULTS,
        ttl: float = 1.0,
        seed: int | None = None,
        slack: float = DEFAULT_SLACK,
        hold: float | None = None,
        history: str | None = None,
        failover_restart: str | None = None,
        failover_kill: str = DEFAULT_KILL,
        store_restart: str | None = None,
        store_failover: str | None = None,
        guarded: str | None = None,
    ) -> CheckResult:
        options = CheckOptions(
            processes=processes, seconds=seconds, faults=tuple(faults), ttl=ttl, seed=seed, slack=slack, hold=hold,
            failover_restart=failover_restart, failover_kill=failover_kill, store_restart=store_restart,
            store_failover=store_failover, guarded=guarded,
        )  # fmt: skip
        with _db_unblocked(request):
            return run_check(config, options, history=history)

    return run


def _db_unblocked(request: pytest.FixtureRequest) -> Any:
    try:
        blocker = request.getfixturevalue("django_db_blocker")
    except pytest.FixtureLookupError:
        return contextlib.nullcontext()
    return blocker.unblock()
