"""The admin's "recover now" and "reap now" as background tasks of Django's Tasks framework.

Imported only when a task backend that runs tasks apart from the request is
configured (see :func:`django_esdlock.operations.background_tasks`): the
framework (``django.tasks`` from Django 6, else the ``django-tasks``
package) is no dependency of the library. A worker (``db_worker`` of
django-tasks-db, ...) runs them; each logs what it did as an admin log
entry of the user who asked.
"""

from __future__ import annotations

from typing import Any

try:  # Django 6
    from django.tasks import task
except ImportError:
    from django_tasks import task

from . import operations


@task()
def reap_task(user_id: Any = None) -> dict[str, int]:
    """One reaper pass over the lock store (as ``reap_locks``); return its counts."""
    return operations.reap_now(user_id, how="as a task").as_dict()["counts"]


@task()
def recover_task(holder_id: str, seen_owner_key: str | None = None, user_id: Any = None) -> dict[str, Any]:
    """Recover one holder with an intent now (the admin's "recover now"); return whether it was and what it did."""
    outcome = operations.recover_now(holder_id, seen_owner_key, user_id, how="as a task")
    return {"ok": outcome.ok, "message": outcome.message}


def enqueue_recover(holder_id: str, seen_owner_key: str | None, user_id: Any) -> str:
    """Enqueue :func:`operations.recover_now` as a task; return the task result's id."""
    return str(recover_task.enqueue(holder_id, seen_owner_key, user_id).id)


def enqueue_reap(user_id: Any) -> str:
    """Enqueue :func:`operations.reap_now` as a task; return the task result's id."""
    return str(reap_task.enqueue(user_id).id)
