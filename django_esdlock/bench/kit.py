"""What the benchmark needs from a store beyond the lock backend: baselines, request counts, bulk fills."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from ..conf import load_backend
from ..records import Kind, Node, Owner
from .common import Goal


@dataclasses.dataclass(frozen=True)
class Baseline:
    """A pair of store operations to hold a lock pair against: ``run()`` does one pair."""

    key: str
    label: str
    run: Callable[[], Any]
    goal: Goal | None = None


class RequestCount:
    """How many requests (round trips) the calling thread sent while counting."""

    def __init__(self) -> None:
        self.value = 0


@contextlib.contextmanager
def statements_counted(backend: Any) -> Iterator[RequestCount]:
    """Count the statements the calling thread sends on a database backend's lock connection."""
    count = RequestCount()

    def counted(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        count.value += 1
        return execute(sql, params, many, context)

    with backend.connection.execute_wrapper(counted):
        yield count


class StoreKit(abc.ABC):
    """One store under test: its lock backend plus the raw operations the figures are held against.

    The kit owns ``backend`` (built from ``config``) and whatever raw
    connections its baselines use; :meth:`close` releases them.
    """

    name: str
    request_word: str
    """What :meth:`counting` counts, for people: "requests" or "round trips"."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.backend = load_backend(config)

    @abc.abstractmethod
    def baselines(self, depth: int) -> list[Baseline]:
        """Return the pairs a tree lock pair at ``depth`` is compared with, with the goals on them."""

    @abc.abstractmethod
    def counting(self) -> contextlib.AbstractContextManager[RequestCount]:
        """Count the requests the calling thread sends to the store through :attr:`backend`."""

    @abc.abstractmethod
    def fill(self, namespace: str, count: int, *, expired: bool) -> None:
        """Write ``count`` nodes with one X holder each straight into the store, in bulk.

        Holders are live for a day, or (``expired``) expired an hour ago by
        the store's clock. Nodes are ``/n<i>`` (:func:`fill_nodes`).
        """

    @abc.abstractmethod
    def delete_raw(self, namespace: str, count: int) -> None:
        """Delete what :meth:`fill` wrote, as plainly as the store allows: the floor of reaping."""

    def facts(self) -> dict[str, Any]:
        """Return settings of the store that change how to read the figures (e.g. fsync)."""
        return {}

    def close(self) -> None:
        self.backend.close()


def fill_nodes(namespace: str, count: int) -> Iterator[Node]:
    """The nodes :meth:`StoreKit.fill` writes: top-level tree nodes ``/n0`` … ``/n<count-1>``."""
    return (Node(namespace, Kind.TREE, f"/n{i}") for i in range(count))


def bench_owner() -> dict[str, Any]:
    """The owner recorded on filled holders: this process, so the admin shows a real one."""
    return Owner.current().as_dict()
