"""What is on: read from the settings at the first lock, again after a settings change; the hooks' guard."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

logger = logging.getLogger("django_esdlock")

DEFAULT_SLOW_WAIT = 1.0


@dataclasses.dataclass(frozen=True)
class State:
    """What is on, as the settings say: read at the first lock, again after a settings change."""

    metrics: Any = None
    """A :class:`.metrics.LockMetrics`, or None."""
    tracing: Any = None
    """A :class:`.tracing.LockTracing`, or None."""
    slow_wait: float | None = DEFAULT_SLOW_WAIT


_state: State | None = None


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here, found without importing it (nothing of it loads)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _load() -> State:
    """Read the settings. A bad one is logged and left off: reporting on locks must not stop them."""
    global _state
    metrics = tracing = None
    if getattr(settings, "ESDLOCK_METRICS", True) and installed("prometheus_client"):
        from .metrics import metrics_on

        registry = getattr(settings, "ESDLOCK_METRICS_REGISTRY", None)
        try:
            metrics = metrics_on(import_string(registry) if isinstance(registry, str) else registry)
        except Exception:
            logger.exception("ESDLOCK_METRICS_REGISTRY %r is not a registry: the locks record no metric", registry)
    if getattr(settings, "ESDLOCK_TRACING", True) and installed("opentelemetry.trace"):
        from .tracing import LockTracing

        tracing = LockTracing()
    slow_wait = getattr(settings, "ESDLOCK_SLOW_WAIT", DEFAULT_SLOW_WAIT)
    try:
        slow_wait = None if slow_wait is None else float(slow_wait)
    except (TypeError, ValueError):
        logger.error("ESDLOCK_SLOW_WAIT must be seconds or None, not %r: using %gs", slow_wait, DEFAULT_SLOW_WAIT)
        slow_wait = DEFAULT_SLOW_WAIT
    _state = State(metrics, tracing, slow_wait)
    return _state


def state() -> State:
    """What is on now."""
    return _state or _load()


def use(new_state: State | None) -> None:
    """Make ``new_state`` what is on, whatever the settings say (lock_bench's on and off); None: the settings."""
    global _state
    _state = new_state


def _reset_on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    global _state
    if setting.startswith("ESDLOCK_"):
        _state = None


setting_changed.connect(_reset_on_setting_changed, dispatch_uid="django_esdlock.observability")


def never_raises(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Log what ``hook`` raises instead: telling about a lock must never change what happens to it."""

    @functools.wraps(hook)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except Exception:
            logger.exception("django_esdlock's %s hook failed; the lock is not affected", hook.__name__)
            return None

    return guarded
