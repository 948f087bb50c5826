"""Listing held locks page by page (:mod:`.listing`), on every store."""

from __future__ import annotations

import pytest

from .listing import ListingContract

pytestmark = pytest.mark.contract


class TestListingContract(ListingContract):
    pass
