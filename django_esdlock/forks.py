"""Threading locks that a forked child gets anew: one another thread held at the fork would stay held there."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any


class ForkSafeLock:
    """A ``threading.Lock`` that is replaced by a new, released one in a forked child.

    Only the forking thread goes on in the child: a lock that the renewer or
    any other thread held at that moment would never be released there, and
    the child's first use of it would hang.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _locks.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


_locks: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _renew_in_child() -> None:
    for lock in list(_locks):
        lock._after_fork()


os.register_at_fork(after_in_child=_renew_in_child)
