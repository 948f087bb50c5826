"""The contract matrix: what every lock store must do, written once and run on every store.

``STORES`` is the one list of stores. Each ``test_*.py`` here runs one
contract over all of them: ``test_lock`` the lock API (:mod:`.lock`),
``test_async_lock`` the same through the async API, ``test_listing`` the
admin's listing (:mod:`.listing`), ``test_reaper`` dead holders and recovery
(:mod:`.reaper`). Every item carries the ``contract`` marker and its
store's marker (``elasticsearch``, ``postgres``, ``sqlite``), which is how
tox and CI select them. What one store does beyond the contract is tested
apart (``tests/test_elasticsearch*.py``, ``tests/test_database*.py``); what
needs no store at all under ``tests/unit/``.

A third store joins the matrix with one entry in ``STORES`` and a way to
make an empty one (``tests/conftest.py``'s ``SharedStores``).
"""

from __future__ import annotations

import pytest

from .lock import all_holders, raw_grant, refused_to_another_owner

STORES = ("elasticsearch", "postgres", "sqlite")
"""Every store the contracts run on."""


def store_params(*stores: str) -> list:
    """The ``params`` of a fixture over ``stores`` (default: all), each marked with its store's marker."""
    return [pytest.param(store, marks=getattr(pytest.mark, store), id=store) for store in stores or STORES]


__all__ = ["STORES", "all_holders", "raw_grant", "refused_to_another_owner", "store_params"]
