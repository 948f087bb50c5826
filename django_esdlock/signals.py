"""Signals sent over a lock's life; each passes ``lock`` (or ``holder``) as keyword."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_esdlock")

lock_acquired = Signal()
"""Sent after a grant, with ``lock``."""

lock_released = Signal()
"""Sent after a release, with ``lock``."""

lock_lost = Signal()
"""Sent when a held lock's lease could not be kept, with ``lock`` and ``reason``."""

lock_reaped = Signal()
"""Sent for each expired holder the reaper removes, with ``holder``."""

lock_recovered = Signal()
"""Sent after a recovery handler finished a dead holder's intent, with ``holder`` and ``lock``."""

lock_recovery_failed = Signal()
"""Sent when a recovery handler raised (the holder stays, marked failed), with ``holder`` and ``error``."""

lock_unrecoverable = Signal()
"""Sent for an expired holder whose intent has no recovery handler, with ``holder``."""

lock_force_released = Signal()
"""Sent when an admin force-releases a holder, with ``holder``, ``records`` and ``user``."""

_NAMES = {signal: name for name, signal in list(globals().items()) if isinstance(signal, Signal)}


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` robustly: a receiver that raises is logged with its traceback and changes nothing else.

    Whatever a receiver does (a metrics client whose server is down), a grant
    stays a grant and the renewer goes on.
    """
    name = _NAMES.get(signal, "a signal")
    try:
        responses = signal.send_robust(sender=sender, **kwargs)
    except Exception:  # e.g. an async receiver sent to from a running event loop
        logger.exception("sending %s failed; the lock is not affected", name)
        return
    for receiver, response in responses:
        if isinstance(response, Exception):
            logger.error(
                "receiver %s of %s raised; the lock is not affected",
                getattr(receiver, "__qualname__", receiver),
                name,
                exc_info=(type(response), response, response.__traceback__),
            )


def _after_fork() -> None:
    # Django's Signal takes its own lock on every send: the renewer may hold one at the fork.
    for signal in _NAMES:
        signal.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
