"""Recovery handlers: how to finish or undo the change of a holder that died.

An app registers one handler per intent ``op``, in a ``recovery.py`` module
(discovered when the app registry is ready) or anywhere imported by then::

    from django_esdlock.recovery import recovery_handler

    @recovery_handler("rename")
    def finish_rename(*, intent, checkpoint, lock):
        ...  # roll forward from checkpoint, stamping lock.token on each write

The reaper calls it holding the dead holder's lock under a new fencing token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

if TYPE_CHECKING:
    from .locks import Lock


class RecoveryHandler(Protocol):
    def __call__(self, *, intent: Mapping[str, Any], checkpoint: Mapping[str, Any] | None, lock: Lock) -> None: ...


_handlers: dict[str, RecoveryHandler] = {}


def recovery_handler(op: str) -> Callable[[RecoveryHandler], RecoveryHandler]:
    """Register the decorated function as the recovery of intents whose ``op`` is ``op``."""
    if not isinstance(op, str) or not op:
        raise ImproperlyConfigured(f"recovery_handler needs a non-empty op string, not {op!r}")

    def register(handler: RecoveryHandler) -> RecoveryHandler:
        existing = _handlers.get(op)
        if existing is not None and existing is not handler:
            raise ImproperlyConfigured(f"two recovery handlers for op {op!r}: {existing!r} and {handler!r}")
        _handlers[op] = handler
        return handler

    return register


def get_handler(op: object) -> RecoveryHandler | None:
    return _handlers.get(op) if isinstance(op, str) else None


def unregister(op: str) -> None:
    """Forget the handler of ``op`` (for tests)."""
    _handlers.pop(op, None)


def autodiscover() -> None:
    """Import the ``recovery`` module of every installed app."""
    autodiscover_modules("recovery")
