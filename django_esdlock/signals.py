"""Signals sent over a lock's life; each passes ``lock`` (or ``holder``) as keyword."""

from django.dispatch import Signal

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
