"""The matrix's one fixture: ``lock_config``, an empty store of each kind in turn (see ``STORES``)."""

from __future__ import annotations

import pytest

from . import store_params


@pytest.fixture(params=store_params())
def lock_config(request, shared_stores, django_db_blocker):
    """A LOCK_BACKEND config on the run's store of this kind, emptied for the test."""
    # The database backend opens connections of its own, which pytest-django blocks unless told.
    with django_db_blocker.unblock():
        yield shared_stores.get(request.param)
