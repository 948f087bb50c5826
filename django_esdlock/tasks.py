"""``@locked(...)``: run a task (Django Tasks, Celery, or a plain function) under a lock its arguments name.

Each keyword that names what to lock (``tree``, ``documents``, ``name``), and
``namespace`` and ``intent``, is either a value or a callable of the task's
arguments. A callable is called with the arguments it names (bound to the
task's signature, defaults applied), so ``tree=lambda src: src`` suits
``def rename(src, dst, ticket=None)``. With ``ticket="ticket"``, a call whose
``ticket`` argument holds a hand-off ticket claims it instead of acquiring; the
ticket must lock exactly what the arguments name (InvalidLockArgument before
the task's body runs otherwise, see handoff.py).
A task that cannot get its lock within ``timeout`` raises the library's
exception (LockUnavailable, LockTimeout): the queue's retry policy decides
what happens next.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from .aio import AsyncLock
from .backends.base import BaseLockBackend
from .core import BaseLock, document_targets, global_targets, tree_targets
from .exceptions import InvalidLockArgument
from .handoff import AsyncResumedLock, ResumedLock, Ticket
from .locks import Lock
from .records import Targets

F = TypeVar("F", bound=Callable[..., Any])


def _from_arguments(value: Any, arguments: Mapping[str, Any]) -> Any:
    """Return ``value``, or if it is callable, what it returns for the arguments it names."""
    if not callable(value):
        return value
    parameters = inspect.signature(value).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return value(**arguments)
    names = {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    return value(**{name: v for name, v in arguments.items() if name in names})


def locked(
    *,
    tree: str | Callable[..., str] | None = None,
    documents: Iterable[str] | Callable[..., Iterable[str]] | None = None,
    name: str | Callable[..., str] | None = None,
    shared: bool = False,
    namespace: str | Callable[..., str] = "default",
    intent: Mapping[str, Any] | Callable[..., Mapping[str, Any] | None] | None = None,
    timeout: float | None = None,
    ttl: float | None = None,
    ticket: str | None = None,
    lock_arg: str | None = None,
    backend: BaseLockBackend | None = None,
) -> Callable[[F], F]:
    """Decorate a task function (sync or async) to run each call under the lock its arguments name.

    Name exactly one of ``tree`` (``lock_tree``; ``shared`` for S), ``documents``
    (``lock_documents``) or ``name`` (``global_lock``). ``timeout``, ``ttl`` and
    ``intent`` mean what they mean for those. ``ticket`` names the argument
    that may carry a hand-off ticket (claimed instead of acquiring; it must
    lock what the arguments name); ``lock_arg`` names a keyword argument the
    function is given the held lock in (for ``lock.token``, ``lock.checkpoint``).
    Put it below the queue's decorator: ``@task`` / ``@app.task`` on top.
    """
    if sum(x is not None for x in (tree, documents, name)) != 1:
        raise InvalidLockArgument("locked() needs exactly one of tree=, documents= or name=")
    if name is not None and (intent is not None or shared):
        raise InvalidLockArgument("a global lock takes no intent and is never shared")
    if documents is not None and (intent is not None or shared):
        raise InvalidLockArgument("document locks take no intent and are never shared")

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        for argument in (ticket, lock_arg):
            if argument is not None and argument not in signature.parameters:
                raise InvalidLockArgument(f"{func.__qualname__}() has no parameter {argument!r}")

        def lock_for(args: tuple[Any, ...], kwargs: dict[str, Any], *, aio: bool) -> BaseLock:
            bound = signature.bind_partial(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            ns = _from_arguments(namespace, arguments)
            if tree is not None:
                wanted_intent = _from_arguments(intent, arguments)
                targets = tree_targets(
                    _from_arguments(tree, arguments), shared=shared, namespace=ns, intent=wanted_intent
                )
            elif documents is not None:
                wanted_intent = None
                targets = document_targets(_from_arguments(documents, arguments), namespace=ns)
            else:
                wanted_intent = None
                targets = global_targets(_from_arguments(name, arguments))
            handed = arguments.get(ticket) if ticket is not None else None
            if handed:
                return _resumed(Ticket.decode(handed), targets, aio=aio)
            cls = AsyncLock if aio else Lock
            reentrant = documents is not None
            return cls(targets, timeout=timeout, ttl=ttl, intent=wanted_intent, reentrant=reentrant, backend=backend)

        def _resumed(handed: Ticket, targets: Targets, *, aio: bool) -> BaseLock:
            # Exactly what the arguments name: a ticket short of an id would let the task write it unheld.
            handed.require_covers(targets, "what the task's arguments name")
            if set(handed.targets) != set(targets):
                raise InvalidLockArgument(
                    f"the ticket locks {[str(n) for n, _ in handed.targets]}, the task's arguments "
                    f"{[str(n) for n, _ in targets]}"
                )
            cls = AsyncResumedLock if aio else ResumedLock
            return cls(handed, ttl=ttl, backend=backend)

        def with_lock(kwargs: dict[str, Any], lock: BaseLock) -> dict[str, Any]:
            return {**kwargs, lock_arg: lock} if lock_arg is not None else kwargs

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                lock = lock_for(args, kwargs, aio=True)
                async with lock:  # type: ignore[attr-defined]
                    return await func(*args, **with_lock(kwargs, lock))

            return run_async  # type: ignore[return-value]

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            lock = lock_for(args, kwargs, aio=False)
            with lock:  # type: ignore[attr-defined]
                return func(*args, **with_lock(kwargs, lock))

        return run  # type: ignore[return-value]

    return decorate
