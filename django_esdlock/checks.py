"""System checks: the lock settings load (every command, migrate too); the store answers (``check --deploy``)."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import load_backend
from .redaction import redact


@checks.register("django_esdlock")
def check_lock_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report settings that do not make a backend. Sends nothing: a deploy's ``migrate`` never waits on the store."""
    try:
        load_backend().close()
    except ImproperlyConfigured as e:
        return [checks.Error(redact(e), hint="Fix settings.LOCK_BACKEND.", id="django_esdlock.E001")]
    return []


@checks.register("django_esdlock", deploy=True)
def check_lock_store(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report a store that cannot be reached or is not set up right; contacts it, so only when asked (``--deploy``)."""
    try:
        backend = load_backend()
    except ImproperlyConfigured:
        return []  # check_lock_settings says why
    try:
        messages = backend.check(**kwargs)
    finally:
        backend.close()
    for message in messages:
        message.msg, message.hint = redact(message.msg), message.hint and redact(message.hint)
    return messages
