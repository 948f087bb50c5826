"""The Elasticsearch lock store, a package: ``django_esdlock.backends.elasticsearch.ElasticsearchLockBackend``.

One module per concern, as Django keeps a store's client apart from its
cache (``cache/backends/redis.py``) and each database vendor in its own
``db/backends/<vendor>/``:

- :mod:`.options`: what OPTIONS and ``LOCK_BACKEND`` URLs mean, credentials,
  lock index names (pure: no client);
- :mod:`.answers`: pure readers of the store's answers (``_bulk`` items,
  fencing tokens, lock documents);
- :mod:`.scripts`: the Painless scripts and what each guarantees;
- :mod:`.transport`: the clients, a store call as a step, ``_bulk``, busy
  and resend handling;
- :mod:`.index`: the lock index's mapping, setup, incarnations and checks;
- :mod:`.protocol`: acquire, release, renew, withdraw, the waiting state;
- :mod:`.maintenance`: listing, eviction, take-over, forced release;
- :mod:`.backend`: the class, its settings and declarations.

The class is composed from one mixin per module
(``ElasticsearchLockBackend(IndexSetup, Maintenance, Protocol, Transport,
BaseLockBackend)``) rather than from collaborator objects: every part shares
one state under one lock (which incarnation of a lock index this process
writes to, what it alone holds), and each operation is one generator of
steps that calls across parts (a release inside a failed acquire, a setup
inside a ``_bulk``); as mixins those stay plain method calls on one object,
where collaborators would pass each other around. Each mixin's docstring
says what it takes from the others.

The class loads on first use (PEP 562 ``__getattr__``): importing
:mod:`.options` to read a URL does not need the ``elasticsearch`` client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import ElasticsearchLockBackend

__all__ = ["ElasticsearchLockBackend"]


def __getattr__(name: str) -> Any:
    if name == "ElasticsearchLockBackend":
        from .backend import ElasticsearchLockBackend

        return ElasticsearchLockBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
