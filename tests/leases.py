"""Make a lease run out in the store itself (back-date it), instead of sleeping until it probably has."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

from django_esdlock.conf import load_backend

from .expiry import expire


def backdate(config: dict, holder_id: str) -> None:
    """End every lease of ``holder_id`` in the store ``config`` names, by the store's own clock (see :mod:`.expiry`)."""
    backend = load_backend(config)
    try:
        expire(backend, holder_id)
    finally:
        backend.close()


def wait_until(predicate: Callable[[], object], what: str, *, timeout: float = 30.0, every: float = 0.02) -> object:
    """Poll ``predicate`` until it returns something true (returned); fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout:g}s"
        time.sleep(every)
    return value


def wait_renewed(backend, lock, *, leases: int, ttl: float, timeout: float = 60.0) -> None:
    """Until the store shows ``lock``'s lease renewed ``leases`` - 1 leases past its first expiry.

    "The lock outlived three leases", read in the store's record of it: a
    renewer at work, not a wait for the clock to pass a moment.
    """
    node = lock.targets[-1][0]

    def expiry():
        records = [r for r in backend.node_holders(node) if r.holder_id == lock.holder_id]
        assert records, f"{lock!r} is no longer in the store"
        return records[0].expires_at

    target = expiry() + datetime.timedelta(seconds=(leases - 1) * ttl)
    wait_until(lambda: expiry() >= target, what=f"{lock!r} renewed past {leases} leases", timeout=timeout)
