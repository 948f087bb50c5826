"""What an operation asks of its driver, and the two drivers: one copy of the logic for sync and async.

After psycopg 3 (``psycopg/generators.py`` yields what to do, ``psycopg/waiting.py``
has ``wait`` and ``wait_async``): the logic of an operation is a generator
that yields steps and is sent each step's result, or thrown its error, and
returns the operation's result. It does no I/O of its own. :func:`drive`
performs the steps with blocking calls, :func:`adrive` awaits them; both
sleep for :class:`Sleep` themselves and hand every other step to the
``perform`` they are given.

The vocabulary, one for the whole package:

- a store call, whose payload each store defines (an Elasticsearch client
  call, a SQL statement, or the waiting loop's :class:`Try` of the backend's
  acquire);
- :class:`Sleep`: pause for a while (a backoff);
- :class:`WaitForRelease`: pause until a release may have happened (the
  store's wake-up where it has one, else a backoff step);
- :class:`LookForDeadlock`: read the store's waiting state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from .records import Node

T = TypeVar("T")

Steps = Generator[Any, Any, T]
"""An operation written as steps: it yields steps, is sent their results (or thrown their errors), returns T."""


@dataclasses.dataclass(frozen=True)
class Sleep:
    """Pause for ``seconds``; the drivers perform it themselves."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class Try:
    """The waiting loop's store call: send the request to the backend's acquire once."""


TRY = Try()


@dataclasses.dataclass(frozen=True)
class WaitForRelease:
    """Pause up to ``seconds`` for a release; ``attempt`` counts the waits so far (a backoff grows with it)."""

    seconds: float
    attempt: int


@dataclasses.dataclass(frozen=True)
class LookForDeadlock:
    """Read the store's waiting state (of ``nodes`` only, when given) for deadlock detection."""

    nodes: tuple[Node, ...] | None = None


def drive(steps: Steps[T], perform: Callable[[Any], Any]) -> T:
    """Run ``steps`` to their end with blocking calls: sleep for a Sleep, ``perform(step)`` for the rest.

    A step's error is thrown into the steps, which decide what it means.
    """
    try:
        step = next(steps)
        while True:
            try:
                result = time.sleep(step.seconds) if isinstance(step, Sleep) else perform(step)
            except Exception as e:  # noqa: BLE001 - the steps decide what a failure means
                step = steps.throw(e)
            else:
                step = steps.send(result)
    except StopIteration as done:
        return done.value


async def adrive(steps: Steps[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """Run ``steps`` to their end on the event loop: :func:`drive`, each step awaited."""
    try:
        step = next(steps)
        while True:
            try:
                result = await asyncio.sleep(step.seconds) if isinstance(step, Sleep) else await perform(step)
            except Exception as e:  # noqa: BLE001 - the steps decide what a failure means
                step = steps.throw(e)
            else:
                step = steps.send(result)
    except StopIteration as done:
        return done.value
