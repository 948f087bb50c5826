"""The lock contract (:mod:`.lock`) through the blocking API, on every store."""

from __future__ import annotations

import pytest

from .lock import LockBackendContract

pytestmark = pytest.mark.contract


class TestLockContract(LockBackendContract):
    pass
