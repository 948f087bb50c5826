"""The semaphore contract (:mod:`.semaphore`) through the blocking API on every store, and through the async API."""

from __future__ import annotations

import pytest

from ..apis import AsyncApi
from .semaphore import SemaphoreContract

pytestmark = pytest.mark.contract


class TestSemaphoreContract(SemaphoreContract):
    pass


class TestAsyncSemaphoreContract(SemaphoreContract):
    api = AsyncApi
