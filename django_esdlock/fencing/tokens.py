"""The token a fenced write carries: from a held lock (checked first) or a bare int carried across processes."""

from __future__ import annotations

from typing import Any

from ..core import BaseLock
from ..exceptions import InvalidLockArgument
from ..modes import Mode

MAX_TOKEN = 2**63 - 1
"""The largest token a fence can hold: a signed 64-bit column (SQL ``bigint``, Elasticsearch ``long``)."""


def lock_namespace(lock: BaseLock) -> str:
    """Return the lock namespace of ``lock`` (every node one lock takes is in one namespace)."""
    return lock.targets[-1][0].namespace


def fence_token(lock_or_token: Any, *, namespace: str | None = None) -> int:
    """Return the fencing token a write under ``lock_or_token`` carries; raise before anything is written.

    A lock is checked first (``lock.check()``: LockLost if it is not held
    with a live lease) and its token used. It must be exclusive: shared
    holders hold at once, so their tokens order nothing between them. With
    ``namespace``, a lock of another namespace is refused (tokens are ordered
    per namespace only). A bare int is taken as it is (a token carried in a
    task or across services): nothing can check where it came from.
    InvalidLockArgument for anything else, for a bool, or for an int out of
    the range a store gives (1 to 2**63 - 1).
    """
    if isinstance(lock_or_token, BaseLock):
        lock = lock_or_token
        if lock.targets[-1][1] is not Mode.X:
            raise InvalidLockArgument(
                f"{lock!r} is shared: shared holders hold at once, so their tokens cannot fence writes; "
                "write under an exclusive lock"
            )
        if namespace is not None and lock_namespace(lock) != namespace:
            raise InvalidLockArgument(
                f"{lock!r} is a lock of namespace {lock_namespace(lock)!r}; these writes are fenced by namespace "
                f"{namespace!r} (tokens are ordered per namespace only)"
            )
        lock.check()
        token = lock.token
        assert token is not None  # check() passed: held
        return token
    if isinstance(lock_or_token, bool) or not isinstance(lock_or_token, int):
        raise InvalidLockArgument(
            f"a fenced write needs a held Lock or its int token, not {type(lock_or_token).__name__}: {lock_or_token!r}"
        )
    if not 1 <= lock_or_token <= MAX_TOKEN:
        raise InvalidLockArgument(f"a fencing token is an int from 1 to 2**63 - 1, not {lock_or_token!r}")
    return int(lock_or_token)
