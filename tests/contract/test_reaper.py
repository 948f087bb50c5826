"""Dead holders and half-done changes (:mod:`.reaper`), on every store."""

from __future__ import annotations

import pytest

from .reaper import ReaperContract

pytestmark = pytest.mark.contract


class TestReaperContract(ReaperContract):
    pass
