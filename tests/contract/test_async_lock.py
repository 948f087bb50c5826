"""The contract suite through the async API (``alock_tree``...): all of it on one store, its async part on every store.

Each backend drives the same request and reading of the answer (sans-I/O)
through a blocking and an async driver. What the stores decide (the mode
matrix, all-or-nothing, tokens) the blocking contract proves on every store;
through the async API it is proven once, on Elasticsearch (whose async
client is the largest async driver). What each store's async driver does by
itself (waiting for a release, renewing, noticing a loss, per-task
reentrancy and deadlock, the decorator) runs on every store.
"""

from __future__ import annotations

import pytest

from ..apis import AsyncApi
from . import store_params
from .lock import LockBackendContract

pytestmark = pytest.mark.contract

ASYNC_DRIVER_TESTS = frozenset(
    {
        "test_document_locks_are_reentrant_and_release_only_their_own",
        "test_timeout_zero_never_waits",
        "test_a_number_waits_for_a_release_then_gives_up",
        "test_timeout_none_waits_for_release",
        "test_waiting_on_own_lock_is_a_deadlock_at_once",
        "test_fencing_tokens_strictly_increase_in_a_namespace",
        "test_renewal_keeps_a_hold_past_its_ttl",
        "test_lock_is_lost_when_its_record_is_removed",
        "test_decorator_acquires_on_each_call",
    }
)
"""The contract tests that go through each store's own async code (aacquire's wait, arenew, aclose...)."""

_missing = ASYNC_DRIVER_TESTS - set(dir(LockBackendContract))
assert not _missing, f"renamed in tests/contract/lock.py? {sorted(_missing)}"


class TestAsyncContract(LockBackendContract):
    """The whole contract through the async API, on the genuine store's kind."""

    api = AsyncApi

    @pytest.fixture(params=store_params("elasticsearch"))
    def lock_config(self, request, shared_stores):
        return shared_stores.get(request.param)


class TestAsyncContractDrivers(LockBackendContract):
    """The async driver's part of the contract on the SQL stores (Elasticsearch's runs above)."""

    api = AsyncApi

    @pytest.fixture(params=store_params("postgres", "sqlite"))
    def lock_config(self, request, shared_stores, django_db_blocker):
        with django_db_blocker.unblock():  # the database backend opens connections of its own
            yield shared_stores.get(request.param)


for _name in dir(LockBackendContract):
    if _name.startswith("test_") and _name not in ASYNC_DRIVER_TESTS:
        setattr(TestAsyncContractDrivers, _name, None)  # not collected: the store decides it, proven above
