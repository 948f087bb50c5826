"""Renames as background tasks: Django's Tasks framework (the django-tasks backport before Django 6).

At most ``FS_MAX_RENAMES`` rename tasks move documents at once, however
many workers run: each takes a slot of the ``renames`` semaphore first (its
waiters served in order), before any tree lock, so slots and tree locks are
always taken in one order.

The page's **Rename (task)** button: the view takes both tree locks at once
(the page shows the rename locked from the first moment), checks the rename
under them, hands the locks off (``lock.handoff``) and enqueues
:func:`rename_task` with the tickets; a ``db_worker`` process claims them
(``resume_lock``: it becomes the holder under a newer fencing token) and
moves the documents. Nothing can take the paths in between, and a ticket no
worker claims runs out after :data:`TICKET_TTL` seconds; its intent then goes
to ``reap_locks`` like a dead rename's. Without tickets the task takes the
locks itself (``fs_race``'s tasks column).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

from django_esdlock import LockError, resume_lock, semaphore
from django_esdlock.backends.base import BaseLockBackend
from django_esdlock.conf import load_backend

from .documents import FsIndex, client_for, fs_index, parent_of
from .renames import (
    NAMESPACE,
    check_found,
    check_rename,
    move_under_locks,
    rename,
    rename_document,
    take_rename_locks,
)

try:  # Django 6
    from django.tasks import task
    from django.tasks.base import TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:
    from django_tasks import task
    from django_tasks.base import TaskResult, TaskResultStatus
    from django_tasks.exceptions import TaskResultDoesNotExist

TICKET_TTL = 60.0
"""Seconds a rename waits in the queue holding its locks, unrenewed, before a worker must have claimed them."""

UNFINISHED = (TaskResultStatus.READY, TaskResultStatus.RUNNING)

PROJECT_DIR = Path(__file__).resolve().parent.parent.parent
"""Where ``manage.py`` is."""

__all__ = ["TICKET_TTL", "UNFINISHED", "TaskResult", "TaskResultDoesNotExist", "enqueue_rename", "rename_task"]


def _index(es_url: str | None, index: str | None) -> FsIndex:
    return FsIndex(client_for(es_url), index or fs_index().name) if es_url else fs_index(index)


@contextlib.contextmanager
def _backend(lock_config: Mapping[str, Any] | None) -> Iterator[BaseLockBackend | None]:
    """The lock backend of ``lock_config`` for one task (closed after it), or None: the settings' backend."""
    if lock_config is None:
        yield None
        return
    backend = load_backend(dict(lock_config))
    try:
        yield backend
    finally:
        backend.close()


def rename_slot(*, namespace: str = NAMESPACE, timeout: float | None = None, backend: Any = None) -> Any:
    """One of the ``FS_MAX_RENAMES`` slots of the ``renames`` semaphore: a rename task holds one while it moves."""
    limit = int(getattr(settings, "FS_MAX_RENAMES", 2))
    return semaphore("renames", limit, namespace=namespace, timeout=timeout, backend=backend)


def _pacing() -> dict[str, Any]:
    """How fast a task moves documents: ``FS_TASK_BATCH_SIZE`` per batch, ``FS_TASK_PAUSE`` seconds between."""
    return {
        "batch_size": int(getattr(settings, "FS_TASK_BATCH_SIZE", 500)),
        "pause": float(getattr(settings, "FS_TASK_PAUSE", 0.0)),
    }


@task()
def rename_task(
    src: str,
    dst: str,
    tickets: Mapping[str, str] | None = None,
    *,
    es_url: str | None = None,
    index: str | None = None,
    namespace: str = NAMESPACE,
    timeout: float | None = None,
    lock_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Rename ``src`` to ``dst`` in a worker: under the locks ``tickets`` hand over, else under its own.

    ``es_url``, ``index`` and ``lock_config`` (a LOCK_BACKEND dict) override the settings' stores (fs_race).
    """
    fs = _index(es_url, index)
    if tickets:
        # A wait for a slot is bounded by half the tickets' lease: tickets that run out meanwhile fail
        # resume_lock, and reap_locks ends their rename as a dead one's (it had moved nothing).
        with rename_slot(namespace=namespace, timeout=TICKET_TTL / 2), contextlib.ExitStack() as stack:
            locks = {role: stack.enter_context(resume_lock(ticket)) for role, ticket in tickets.items()}
            kind, moved, token = move_under_locks(fs, src, dst, locks, **_pacing())
    else:
        with _backend(lock_config) as backend, rename_slot(namespace=namespace, timeout=timeout, backend=backend):
            result = rename(fs, src, dst, namespace=namespace, timeout=timeout, backend=backend, **_pacing())
        kind, moved, token = result.kind, result.moved, result.token
    return {"src": src, "dst": dst, "kind": kind, "moved": moved, "token": token, "pid": os.getpid()}


@task()
def rename_document_task(
    doc_id: str,
    new_name: str,
    *,
    es_url: str | None = None,
    index: str | None = None,
    namespace: str = NAMESPACE,
    timeout: float | None = None,
    lock_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Give document ``doc_id`` the name ``new_name``, wherever it is when locked (``fs_race``'s user)."""
    with _backend(lock_config) as backend:
        options = {"namespace": namespace, "timeout": timeout, "backend": backend}
        result = rename_document(_index(es_url, index), doc_id, new_name, **options)
    return {"src": result.src, "dst": result.dst, "moved": result.moved, "token": result.token, "pid": os.getpid()}


def enqueue_rename(index: FsIndex, src: str, dst: str, *, timeout: float) -> TaskResult:
    """Lock and check a rename here, then hand it to a worker; return the enqueued task's result.

    Raise what :func:`~.renames.rename` raises before it moves anything
    (LockUnavailable, LockTimeout, RenameError): nothing is enqueued then.
    """
    check_rename(src, dst)
    with contextlib.ExitStack() as stack:
        locks = take_rename_locks(stack, index.name, src, dst, timeout=timeout)
        index.refresh()
        check_found(src, dst, index.at(src), index.at(dst), index.at(parent_of(dst)), expect_id=None)
        tickets = {role: lock.handoff(ttl=TICKET_TTL) for role, lock in locks.items()}
    try:
        return rename_task.enqueue(src, dst, tickets)
    except BaseException:
        for ticket in tickets.values():  # not enqueued: take the locks back and give them up
            with contextlib.suppress(LockError), resume_lock(ticket):
                pass
        raise


# --- worker processes ------------------------------------------------------------------


def worker_command(*, interval: float = 0.2) -> list[str]:
    """``manage.py db_worker`` of this project, polling every ``interval`` seconds."""
    options = ["--no-reload", "--no-startup-delay", "--interval", f"{interval:g}"]
    return [sys.executable, str(PROJECT_DIR / "manage.py"), "db_worker", *options]


def start_worker(env: Mapping[str, str] | None = None, *, log: Any = None) -> subprocess.Popen:
    """Start a ``db_worker`` beside this process, with this process's environment plus ``env``."""
    return subprocess.Popen(
        worker_command(),
        cwd=PROJECT_DIR,
        env={**os.environ, **(env or {})},
        stdout=log if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
    )


def stop_worker(process: subprocess.Popen, *, timeout: float = 10) -> None:
    """Stop a worker: SIGTERM lets it finish its task within ``timeout``; then it is killed (reap_locks finishes)."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)


@contextlib.contextmanager
def workers(count: int, env: Mapping[str, str] | None = None) -> Iterator[list[subprocess.Popen]]:
    """Run ``count`` workers for the length of the block; stop them all after it."""
    started: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            started.append(start_worker(env))
        yield started
    finally:
        for process in started:
            stop_worker(process)
