"""The contract suite through the async API (``alock_tree``...), on every store."""

from __future__ import annotations

import pytest

from .apis import AsyncApi
from .contract import LockBackendContract


class TestAsyncContract(LockBackendContract):
    api = AsyncApi

    @pytest.fixture
    def lock_config(self, store_config):
        return store_config
