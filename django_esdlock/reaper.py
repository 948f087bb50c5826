"""The reaper: removes dead holders and recovers the changes they left half done."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import signals
from .backends.base import BaseLockBackend
from .locks import Lock
from .records import HolderRecord, Owner, main_record, process_start
from .recovery import get_handler

logger = logging.getLogger("django_esdlock")


def process_is_gone(owner: dict[str, Any], *, host: str | None = None) -> bool:
    """Return True if ``owner`` ran on this host and its process provably no longer runs.

    Provably: its pid is not alive, or the pid now belongs to a process that
    started later (a different start identity). Owners of other hosts, and
    pids this host cannot inspect, are never declared dead.
    """
    if owner.get("host") != (host or socket.gethostname()):
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, someone else's: fall through to the start identity
    started = owner.get("started")
    current = process_start(pid)
    return started is not None and current is not None and current != started


@dataclasses.dataclass
class ReapReport:
    """What one reaper run did (or, with ``dry_run``, would do)."""

    dry_run: bool
    evicted: list[HolderRecord] = dataclasses.field(default_factory=list)
    dead_local: list[HolderRecord] = dataclasses.field(default_factory=list)
    recovered: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    failed: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unrecoverable: list[HolderRecord] = dataclasses.field(default_factory=list)
    to_recover: list[HolderRecord] = dataclasses.field(default_factory=list)
    taken_by_other_reaper: list[HolderRecord] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "evicted": [r.as_dict() for r in self.evicted],
            "dead_local": [r.as_dict() for r in self.dead_local],
            "recovered": self.recovered,
            "failed": self.failed,
            "unrecoverable": [r.as_dict() for r in self.unrecoverable],
            "to_recover": [r.as_dict() for r in self.to_recover],
            "taken_by_other_reaper": [r.as_dict() for r in self.taken_by_other_reaper],
            "counts": {
                "evicted": len(self.evicted),
                "dead_local": len(self.dead_local),
                "recovered": len(self.recovered),
                "failed": len(self.failed),
                "unrecoverable": len(self.unrecoverable),
                "to_recover": len(self.to_recover),
            },
        }


def _by_holder(records: Iterable[HolderRecord]) -> dict[str, list[HolderRecord]]:
    groups: dict[str, list[HolderRecord]] = {}
    for record in records:
        groups.setdefault(record.holder_id, []).append(record)
    return groups


class Reaper:
    """One pass over a store: evict expired holders, free dead local ones, recover intents."""

    def __init__(
        self,
        backend: BaseLockBackend,
        *,
        namespace: str | None = None,
        grace: float = 0.0,
        dry_run: bool = False,
        local_pids: bool = False,
        progress: Callable[[str, int], None] | None = None,
    ) -> None:
        self.backend = backend
        self.namespace = namespace
        self.grace = grace
        self.dry_run = dry_run
        self.local_pids = local_pids
        self.progress = progress or (lambda stage, count: None)

    def run(self) -> ReapReport:
        report = ReapReport(dry_run=self.dry_run)
        self._evict_expired(report)
        if self.local_pids:
            self._free_dead_local(report)
        for records in _by_holder(
            self.backend.expired_with_intent(namespace=self.namespace, grace=self.grace)
        ).values():
            self._recover(records, report, require_expired=True)
        return report

    def _evict_expired(self, report: ReapReport) -> None:
        report.evicted = self.backend.evict_expired(
            namespace=self.namespace,
            grace=self.grace,
            dry_run=self.dry_run,
            progress=lambda count: self.progress("evicted", count),
        )
        if not self.dry_run:
            for record in report.evicted:
                logger.info("reaped expired holder %s of %s (%s)", record.holder_id, record.node, record.mode)
                signals.send(signals.lock_reaped, sender=type(self), holder=record)

    def _all_holders(self) -> Iterator[HolderRecord]:
        cursor = None
        while True:
            page = self.backend.holders(namespace=self.namespace, cursor=cursor, limit=500)
            yield from page.holders
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def _free_dead_local(self, report: ReapReport) -> None:
        host = socket.gethostname()
        dead = [r for r in self._all_holders() if process_is_gone(dict(r.owner), host=host) and not r.recovery]
        for holder_id, records in _by_holder(dead).items():
            if any(r.intent for r in records):
                self._recover(records, report, require_expired=False)
                continue
            if not self.dry_run:
                self.backend.force_release(holder_id, [r.node for r in records])
                for record in records:
                    logger.info("freed holder %s of %s: its process is gone", holder_id, record.node)
                    signals.send(signals.lock_reaped, sender=type(self), holder=record)
            report.dead_local.extend(records)
        self.progress("dead_local", len(report.dead_local))

    def _recover(self, records: list[HolderRecord], report: ReapReport, *, require_expired: bool) -> None:
        main = main_record(records)
        intent = dict(main.intent or {})
        handler = get_handler(intent.get("op"))
        if handler is None:
            report.unrecoverable.append(main)
            logger.error("holder %s of %s has intent %r but no recovery handler", main.holder_id, main.node, intent)
            signals.send(signals.lock_unrecoverable, sender=type(self), holder=main)
            return
        if self.dry_run:
            report.to_recover.append(main)
            return
        attempts = int((main.recovery or {}).get("attempts", 0)) + 1
        owner = Owner.current()
        started = time.monotonic()
        grant = self.backend.take_over(
            records,
            owner,
            ttl=self.backend.ttl,
            recovery={"state": "running", "attempts": attempts, "reaper": owner.as_dict()},
            require_expired=require_expired,
        )
        if grant is None:
            report.taken_by_other_reaper.append(main)
            return
        lock = Lock.adopt(grant, self.backend, started=started)
        entry = {"holder": main.as_dict(), "token": grant.token, "attempts": attempts}
        try:
            handler(intent=intent, checkpoint=main.checkpoint, lock=lock)
        except Exception as e:  # any handler failure is recorded, and retried next run
            error = f"{type(e).__name__}: {e}"
            logger.exception("recovery of %s (%s) failed", main.node, intent.get("op"))
            lock.abandon(recovery={"state": "failed", "attempts": attempts, "error": error})
            report.failed.append({**entry, "error": error})
            signals.send(signals.lock_recovery_failed, sender=type(self), holder=main, error=error)
            return
        lock.release()
        report.recovered.append(entry)
        logger.info("recovered %s (%s) under token %s", main.node, intent.get("op"), grant.token)
        signals.send(signals.lock_recovered, sender=type(self), holder=main, lock=lock)
