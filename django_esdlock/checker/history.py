"""The history of a lock_check run: flat events written as JSON lines, read back as operations.

Every event carries ``t`` (``time.monotonic()``: one clock for every process
of a Linux machine, so events of different processes compare), ``wall``
(``time.time()``, for people), ``process`` and ``type``. A worker writes its
own file and flushes each line, so a SIGKILL loses nothing it recorded.

Event types: ``invoke`` / ``ok`` / ``fail`` (a lock request), ``write`` (an
action under the lock, stamped with its fencing token; ``valid`` says whether
``lock.lost`` was False when it began), ``checkpoint``, ``lost`` (the holder
was told), ``release`` / ``released``; from the command: ``spawn``, ``exit``,
``pause`` / ``resume``, ``kill``, ``cut`` / ``restore``, ``recovered`` (the
reaper took a dead holder over and ran its recovery), ``leftover``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from ..redaction import redact_data

OUTCOMES = ("granted", "timeout", "unavailable", "store_unavailable", "deadlock")
"""How a request may end (issue (c)); anything else is a violation."""


class HistoryWriter:
    """Append events to one JSON-lines file, flushed line by line; safe across threads."""

    def __init__(self, path: str | os.PathLike[str], process: str) -> None:
        self.process = process
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def record(self, type_: str, *, t: float | None = None, **fields: Any) -> float:
        """Write one event (now, unless ``t`` is given); return its monotonic time."""
        now = time.monotonic() if t is None else t
        event = {"t": now, "wall": time.time() - (time.monotonic() - now), "process": self.process, "type": type_}
        event.update(fields)
        line = json.dumps(event, ensure_ascii=False, default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
        return now

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_events(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Read and merge event files in time order; a torn last line (a killed writer) is skipped."""
    events: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    events.sort(key=lambda e: e["t"])
    return events


def write_history(events: list[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write ``events`` to ``path`` as JSON lines, redacted (the file is for people and CI artifacts)."""
    with open(path, "w", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(redact_data(event), ensure_ascii=False, default=str) + "\n")


def load_history(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    return read_events([Path(path)])


@dataclasses.dataclass
class Operation:
    """One lock request and, if granted, its hold: the events of one ``op`` id put together."""

    op: str
    process: str
    invoke: dict[str, Any]
    done: dict[str, Any] | None = None
    writes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    checkpoints: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    lost: dict[str, Any] | None = None
    release: dict[str, Any] | None = None
    released: dict[str, Any] | None = None
    recovery: bool = False

    @property
    def events(self) -> list[dict[str, Any]]:
        found = [self.invoke, self.done, *self.writes, *self.checkpoints, self.lost, self.release, self.released]
        return sorted((e for e in found if e is not None), key=lambda e: e["t"])

    @property
    def granted(self) -> bool:
        return self.done is not None and self.done["type"] == "ok"

    @property
    def token(self) -> int | None:
        return self.done.get("token") if self.granted else None  # type: ignore[union-attr]

    @property
    def nodes(self) -> list[tuple[str, str, str, str]]:
        """(namespace, kind, key, mode) of every node the request asked for."""
        return [tuple(n) for n in self.invoke["nodes"]]  # type: ignore[misc]

    @property
    def namespace(self) -> str:
        return self.nodes[-1][0]

    @property
    def has_intent(self) -> bool:
        return bool(self.invoke.get("intent"))

    @property
    def span_end(self) -> float:
        """The last moment this holder acted as holder with a lease it could trust.

        The latest of its grant, its writes and its release call begun while
        ``lock.lost`` was still False: a correct store grants no conflicting
        request before then.
        """
        assert self.done is not None
        valid = [e["t"] for e in (*self.writes, self.release or {}) if e.get("valid")]
        return max(valid, default=self.done["t"])


def operations(events: Iterable[dict[str, Any]]) -> dict[str, Operation]:
    """Group request events by op id, in invocation order."""
    ops: dict[str, Operation] = {}
    for event in events:
        op_id = event.get("op")
        kind = event["type"]
        if op_id is None:
            continue
        if kind == "invoke":
            ops[op_id] = Operation(op_id, event["process"], event, recovery=bool(event.get("recovery")))
            continue
        op = ops.get(op_id)
        if op is None:
            continue
        if kind in ("ok", "fail"):
            op.done = event
        elif kind == "write":
            op.writes.append(event)
        elif kind == "checkpoint":
            op.checkpoints.append(event)
        elif kind == "lost":
            op.lost = op.lost or event
        elif kind == "release":
            op.release = event
        elif kind == "released":
            op.released = event
    return ops
