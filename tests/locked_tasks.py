"""Task functions under ``@locked``, importable by spawned workers: a Django Tasks task, plain and async ones."""

from __future__ import annotations

import time

from django_esdlock import locked

try:
    from django.tasks import task  # Django 6

    IMMEDIATE_BACKEND = "django.tasks.backends.immediate.ImmediateBackend"
except ImportError:
    from django_tasks import task

    IMMEDIATE_BACKEND = "django_tasks.backends.immediate.ImmediateBackend"

from .stress import leaves_under

SHARED: dict = {}
"""What a worker process's tasks write to: counters and a violation count in shared memory (set by the worker)."""


def _bump(path: str, lock) -> None:
    """Read-modify-write the counters of the leaves below ``path``, which only the lock protects."""
    counters, last_tokens, violations = SHARED["counters"], SHARED["last_tokens"], SHARED["violations"]
    targets = leaves_under(path)
    values = [counters[i] for i in targets]
    time.sleep(0.002)  # widen the window a lost update needs
    for i, value in zip(targets, values, strict=True):
        counters[i] = value + 1
        if lock.token <= last_tokens[i]:
            violations.value += 1
        last_tokens[i] = lock.token


@task()
@locked(tree=lambda path: path, namespace="tasks", timeout=30, lock_arg="lock")
def bump(path: str, lock=None) -> int:
    """A Django Tasks task: bump the leaves below ``path`` under lock_tree(path)."""
    _bump(path, lock)
    return lock.token


@locked(tree=lambda path: path, namespace="tasks", timeout=30, lock_arg="lock")
async def abump(path: str, lock=None) -> int:
    """The same as a coroutine function, under alock_tree(path)."""
    _bump(path, lock)
    return lock.token


@locked(
    tree=lambda src: src,
    namespace="fs",
    intent=lambda src, dst: {"op": "test-append", "file": dst},
    timeout=0,
    ticket="ticket",
    lock_arg="lock",
)
def rename(src: str, dst: str, ticket: str | None = None, lock=None) -> dict:
    """A plain function: what it held, for the tests to compare with the view's lock."""
    return {"token": lock.token, "intent": lock.intent, "checkpoint": lock.last_checkpoint, "holder": lock.holder_id}


@locked(tree=lambda src: src, namespace="fs", timeout=0, ticket="ticket", lock_arg="lock")
async def arename(src: str, ticket: str | None = None, lock=None) -> dict:
    """The async twin of :func:`rename`, without intent."""
    return {"token": lock.token, "holder": lock.holder_id, "resumed": hasattr(lock, "ticket")}


@locked(documents=lambda ids: ids, namespace="orders", timeout=0, lock_arg="lock")
def ship(ids: list[str], lock=None) -> int:
    return lock.token


@locked(name=lambda job: f"nightly-{job}", timeout=0)
def nightly(job: str) -> str:
    return job


SHIPPED: list[list[str]] = []
"""The ids each run of :func:`ship_handed` wrote (its body ran)."""


@locked(documents=lambda ids: ids, namespace="orders", timeout=0, ticket="ticket", lock_arg="lock")
def ship_handed(ids: list[str], ticket: str | None = None, lock=None) -> dict:
    """A task that writes every document it names, maybe under a view's ticket: its lock must cover them all."""
    SHIPPED.append(sorted(ids))
    return {"holder": lock.holder_id, "documents": sorted(node.key for node, _ in lock.targets)}
