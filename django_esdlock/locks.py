"""Locks for blocking code: ``with lock_tree(...)``, and the chapter's three schemes as functions."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from . import observability
from .backends.base import BaseLockBackend
from .core import (
    BaseLock,
    document_targets,
    global_targets,
    read_wait_state,
    registry,
    semaphore_targets,
    tree_targets,
    validate_limit,
)
from .records import Grant
from .renewal import renewer
from .steps import TRY, LookForDeadlock, drive

logger = logging.getLogger("django_esdlock")


class Lock(BaseLock, contextlib.ContextDecorator):
    """A lock for blocking code: a context manager, or a decorator (each call acquires anew)."""

    def _recreate_cm(self) -> Lock:
        return type(self)(
            self.targets,
            timeout=self.timeout,
            ttl=self.ttl,
            intent=self.intent,
            reentrant=self.reentrant,
            holder_limit=self.holder_limit,
            backend=self._backend,
        )

    def acquire(self) -> Lock:
        """Take the lock, waiting as ``timeout`` says; return self."""
        with observability.acquiring(self):
            return self._acquire()

    def _acquire(self) -> Lock:
        backend, request = self._start()
        granted: list[Grant] = []  # a grant that came back before an error: given back

        def perform(step: Any) -> Any:
            if step is TRY:
                grant = backend.acquire(request)
                if grant is not None:
                    granted.append(grant)
                return grant
            if isinstance(step, LookForDeadlock):
                return read_wait_state(backend, step.nodes)
            return backend.wait_release(request, step.seconds, step.attempt)

        try:
            grant, started = drive(self._attempts(backend, request), perform)
        except BaseException:
            for grant in granted:
                self._give_back(backend, grant)
            if request.ticket is not None:
                with contextlib.suppress(Exception):  # the markers expire by themselves anyway
                    backend.withdraw(request)
            raise
        self._hold_or_give_back(backend, grant, started)
        return self

    def _hold_or_give_back(self, backend: BaseLockBackend, grant: Grant, started: float) -> None:
        """:meth:`_hold` the grant; if that fails, give it back to the store before the error goes on."""
        try:
            self._hold(grant, started)
        except BaseException:
            self._give_back(backend, grant)
            raise

    @staticmethod
    def _give_back(backend: BaseLockBackend, grant: Grant) -> None:
        """Release a grant that never reached the caller, best-effort: its lease ends it otherwise."""
        try:
            backend.release(grant)
        except Exception:  # the error that made us give it back is the one to see
            logger.warning("could not give back a grant of %s", grant.taken[-1:] or "nothing", exc_info=True)

    def release(self) -> None:
        """Give the lock back; raise LockLost if it had been lost meanwhile."""
        grant = self._grant
        if grant is None or self._forget_inherited():
            return
        was_lost = self._letting_go()
        try:
            still_held = self.backend.release(grant)
        finally:
            self._grant = None
        self._released(still_held, was_lost)

    def checkpoint(self, data: Mapping[str, Any]) -> None:
        """Record how far the work under this lock got (and renew the lease)."""
        checkpoint = self._checkpoint_data(data)
        self.check()
        assert self._grant is not None
        started = time.monotonic()
        if not self.backend.renew(self._grant, checkpoint=checkpoint, timeout=self._call_timeout()):
            self._mark_lost("its holder record was gone at checkpoint")
            self.check()
        self._checkpoint = checkpoint
        self._renewed(started)
        observability.checkpointed(self)

    def handoff(self, ttl: float | None = None) -> str:
        """Give the lock to whoever claims the returned ticket with :func:`~django_esdlock.resume_lock`.

        The lease is set to ``ttl`` seconds from now (default: the lock's TTL)
        and nobody renews it until the ticket is claimed: that is how long the
        ticket stays valid. This lock stops renewing, and its release (or the
        end of its ``with`` block) no longer gives the lock back. Raise
        LockLost if the lock was already lost.
        """
        timeout = self._call_timeout()
        renewed = self._handoff_start(ttl)
        try:
            ok = self.backend.renew(renewed, timeout=timeout)
        except BaseException:
            self._handoff_failed()
            raise
        return self._handed(renewed, ok)

    @classmethod
    def adopt(cls, grant: Grant, backend: BaseLockBackend, *, started: float) -> Lock:
        """Hold a grant made outside :meth:`acquire` (a reaper's takeover), renewing it."""
        lock = cls(grant.request.targets, ttl=grant.request.ttl, intent=grant.request.intent, backend=backend)
        lock._grant = grant
        lock._pid = os.getpid()
        lock._valid_until = started + backend.held_for(grant.request.ttl)
        registry.add(lock)
        renewer.add(lock, grant.request.ttl)
        return lock

    def abandon(self, *, recovery: Mapping[str, Any] | None = None) -> None:
        """Stop renewing and forget the grant without releasing it: its lease will run out.

        With ``recovery``, record it with the holders first (a failed recovery
        stays visible and is retried once the lease is gone).
        """
        grant = self._grant
        if grant is None or self._forget_inherited():
            return
        renewer.remove(self)
        registry.remove(self)
        self._grant = None
        if recovery is not None:
            self.backend.renew(grant, recovery=dict(recovery))

    # --- context manager ------------------------------------------------------

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.release()
            return
        try:
            self.release()
        except Exception:
            # The block's own exception is the one to see; the lease ends the lock anyway.
            logger.warning("releasing %r after %s failed", self, exc_type.__name__, exc_info=True)


def lock_tree(
    path: str,
    *,
    shared: bool = False,
    timeout: float | None = None,
    ttl: float | None = None,
    namespace: str = "default",
    intent: Mapping[str, Any] | None = None,
    backend: BaseLockBackend | None = None,
) -> Lock:
    """Lock ``path`` and the subtree below it: X on it (S if ``shared``), IX (IS) on its ancestors.

    :param path: An absolute ``/``-separated path (:exc:`~django_esdlock.InvalidLockPath` otherwise).
    :param shared: S instead of X: readers share the subtree, and exclude writers.
    :param timeout: Seconds to wait for the grant: ``None`` waits as long as it takes, ``0`` never waits
        (:exc:`~django_esdlock.LockUnavailable` at once); past it, :exc:`~django_esdlock.LockTimeout`.
    :param ttl: Seconds of the lease (renewed in the background while held); default ``LOCK_BACKEND["TTL"]``.
    :param backend: A backend of its own (tests, a second store); default :func:`~django_esdlock.get_backend`.
    :param namespace: The lock space; the same path in two namespaces is two unrelated locks.
    :param intent: What the holder is about to do (a JSON-able dict, kept with the lock): if the holder dies,
        ``reap_locks`` hands it to the recovery handler registered for it.
    """
    targets = tree_targets(path, shared=shared, namespace=namespace, intent=intent)
    return Lock(targets, timeout=timeout, ttl=ttl, intent=intent, backend=backend)


def global_lock(
    name: str = "global",
    *,
    timeout: float | None = None,
    ttl: float | None = None,
    backend: BaseLockBackend | None = None,
) -> Lock:
    """Lock one named lock exclusively: the chapter's global lock.

    :param name: The lock's name; every ``global_lock`` of the same name excludes the others.
    :param timeout: Seconds to wait for the grant: ``None`` waits as long as it takes, ``0`` never waits
        (:exc:`~django_esdlock.LockUnavailable` at once); past it, :exc:`~django_esdlock.LockTimeout`.
    :param ttl: Seconds of the lease (renewed in the background while held); default ``LOCK_BACKEND["TTL"]``.
    :param backend: A backend of its own (tests, a second store); default :func:`~django_esdlock.get_backend`.
    """
    return Lock(global_targets(name), timeout=timeout, ttl=ttl, backend=backend)


def lock_documents(
    ids: Iterable[str],
    *,
    namespace: str = "default",
    timeout: float | None = None,
    ttl: float | None = None,
    backend: BaseLockBackend | None = None,
) -> Lock:
    """Lock many document ids at once, all or nothing; ids this thread holds already are kept.

    :param ids: The document ids (at most ``LOCK_BACKEND["MAX_IDS_PER_REQUEST"]``, 1,000 by default).
    :param namespace: The lock space (e.g. the index the documents live in).
    :param timeout: Seconds to wait for the grant: ``None`` waits as long as it takes, ``0`` never waits
        (:exc:`~django_esdlock.LockUnavailable` at once); past it, :exc:`~django_esdlock.LockTimeout`.
    :param ttl: Seconds of the lease (renewed in the background while held); default ``LOCK_BACKEND["TTL"]``.
    :param backend: A backend of its own (tests, a second store); default :func:`~django_esdlock.get_backend`.
    """
    targets = document_targets(ids, namespace=namespace)
    return Lock(targets, timeout=timeout, ttl=ttl, reentrant=True, backend=backend)


def semaphore(
    name: str,
    limit: int,
    *,
    namespace: str = "default",
    timeout: float | None = None,
    ttl: float | None = None,
    intent: Mapping[str, Any] | None = None,
    backend: BaseLockBackend | None = None,
) -> Lock:
    """Take one of ``limit`` slots of the semaphore ``name``: at most ``limit`` holders at once, served in order.

    Each holder has its own lease, fencing token, intent and checkpoints, as
    a lock's. Waiters are granted in the order they came (a request that
    waits is never passed by a later one). The limit the holders were
    granted under stands while any of them holds: a request that asks
    another is judged against it, and logs a warning naming both
    (:attr:`Lock.limit` is the one that stood).

    :param name: The semaphore's name within its namespace.
    :param limit: How many may hold it at once, an int of at least 1
        (:exc:`~django_esdlock.InvalidLockArgument` otherwise, nothing sent).
    :param namespace: The lock space; the same name in two namespaces is two semaphores.
    :param timeout: Seconds to wait for a slot: ``None`` waits as long as it takes, ``0`` never waits
        (:exc:`~django_esdlock.LockUnavailable` at once); past it, :exc:`~django_esdlock.LockTimeout`.
    :param ttl: Seconds of the lease (renewed in the background while held); default ``LOCK_BACKEND["TTL"]``.
    :param intent: What the holder is about to do (a JSON-able dict with an ``op``): if it dies,
        ``reap_locks`` hands it to the recovery handler registered for it.
    :param backend: A backend of its own (tests, a second store); default :func:`~django_esdlock.get_backend`.
    """
    targets = semaphore_targets(name, namespace=namespace)
    return Lock(targets, timeout=timeout, ttl=ttl, intent=intent, holder_limit=validate_limit(limit), backend=backend)
