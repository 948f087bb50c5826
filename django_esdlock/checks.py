"""System checks: the lock settings load and the store answers as expected."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import load_backend


@checks.register("django_esdlock")
def check_lock_backend(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        backend = load_backend()
    except ImproperlyConfigured as e:
        return [checks.Error(str(e), hint="Fix settings.LOCK_BACKEND.", id="django_esdlock.E001")]
    try:
        return backend.check(**kwargs)
    finally:
        backend.close()
