"""The reaper: removes dead holders and recovers the changes they left half done."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from . import observability, signals
from .backends.base import BaseLockBackend
from .locks import Lock
from .modes import is_grant
from .records import HolderRecord, Owner, main_record, pid_namespace, process_start
from .recovery import get_handler

logger = logging.getLogger("django_esdlock")


def process_is_gone(owner: Mapping[str, Any], *, host: str | None = None, pidns: str | None = None) -> bool:
    """Return True if ``owner`` ran on this host, in this pid namespace, and its process provably no longer runs.

    Provably: its pid is not alive, or the pid now belongs to a process that
    started later (a different start identity). Owners of other hosts or of
    other pid namespaces (a container sharing the host's name and network
    numbers its processes apart), owners that recorded no namespace, and pids
    this host cannot inspect are never declared dead.
    """
    if owner.get("host") != (host or socket.gethostname()):
        return False
    ours = pidns or pid_namespace()
    if ours is None or owner.get("pidns") != ours:
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
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


RECOVERING = "recovering"
"""Recovery state of a holder a reaper took over to run its handler (set by the conditional take-over)."""
DONE = "done"
"""Recovery state of a holder whose handler finished: a later pass only releases it."""
FAILED = "failed"
"""Recovery state of a holder whose handler raised: retried once the reaper's lease runs out."""


EVICTED_LEASE = 0.001
"""Seconds of the lease an evicting take-over gives (the shortest a store stamps): its lock delay starts then."""


def release_if_unchanged(backend: BaseLockBackend, records: Sequence[HolderRecord]) -> bool:
    """Force-release one holder, only if it is still the one listed; return True if released.

    Still the one listed: the same owner and the same lease as in ``records``
    (as read): a holder renewed since (its process lives), claimed by a hand-off
    or taken over by a reaper stays. A conditional take-over by this process
    decides it (of several callers exactly one wins), then a release by the
    taker; whatever that leaves (a failure in between) ends with the taker's
    lease. An intent goes with the holder: recover it first if it matters.

    With a lock delay (``LOCK_DELAY``) a holder without an intent is evicted,
    not released: taken over with a lease that ends at once, it blocks its
    nodes for the delay, as a holder whose lease ran out does (its process
    may still write). One with an intent is released at once: keeping it
    would keep its intent for a recovery that was asked not to happen.
    """
    evict = backend.lock_delay > 0 and not any(record.intent for record in records)
    grant = backend.take_over(
        records,
        Owner.current(),
        ttl=EVICTED_LEASE if evict else backend.ttl,
        recovery=None,
        require_expired=False,
        require_unchanged=True,
    )
    if grant is None:
        return False
    if not evict:
        backend.release(grant)
    return True


@dataclasses.dataclass
class ReapReport:
    """What one reaper run did (or, with ``dry_run``, would do)."""

    dry_run: bool
    evicted: list[HolderRecord] = dataclasses.field(default_factory=list)
    dead_local: list[HolderRecord] = dataclasses.field(default_factory=list)
    recovered: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    finished: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Holders whose handler had finished on an earlier pass (state ``done``), released now without running it."""
    failed: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unrecoverable: list[HolderRecord] = dataclasses.field(default_factory=list)
    to_recover: list[HolderRecord] = dataclasses.field(default_factory=list)
    taken_by_other_reaper: list[HolderRecord] = dataclasses.field(default_factory=list)
    changed: list[HolderRecord] = dataclasses.field(default_factory=list)
    """Holders renewed, claimed or taken over between listing and freeing them: left held."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "evicted": [r.as_dict() for r in self.evicted],
            "dead_local": [r.as_dict() for r in self.dead_local],
            "recovered": self.recovered,
            "finished": self.finished,
            "failed": self.failed,
            "unrecoverable": [r.as_dict() for r in self.unrecoverable],
            "to_recover": [r.as_dict() for r in self.to_recover],
            "taken_by_other_reaper": [r.as_dict() for r in self.taken_by_other_reaper],
            "changed": [r.as_dict() for r in self.changed],
            "counts": {
                "evicted": len(self.evicted),
                "dead_local": len(self.dead_local),
                "recovered": len(self.recovered),
                "finished": len(self.finished),
                "failed": len(self.failed),
                "unrecoverable": len(self.unrecoverable),
                "to_recover": len(self.to_recover),
                "changed": len(self.changed),
            },
        }


def _by_holder(records: Iterable[HolderRecord]) -> dict[str, list[HolderRecord]]:
    groups: dict[str, list[HolderRecord]] = {}
    for record in records:
        groups.setdefault(record.holder_id, []).append(record)
    return groups


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class Reaper:
    """One pass over a store: evict expired holders, free dead local ones, recover intents.

    Recovery is at least once underneath: a handler runs under a lock taken
    over with a new fencing token, and a holder is marked ``recovering``
    (by that conditional take-over) before its handler runs and ``done`` after;
    a later pass releases a ``done`` holder without running the handler again.
    A handler that finished may still run twice if marking it ``done`` fails
    (the store is down, the lease ran out): handlers must be idempotent. One
    holder's failure (its handler, the store, a receiver) is reported in
    ``failed`` and never stops the pass.

    The store's lock delay (``LOCK_DELAY``) is added to ``grace``: a holder
    whose lease ended less than that long ago is neither evicted nor
    recovered, since its process may still write.
    """

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
        with observability.reaping(self.backend, self.namespace, self.dry_run) as reap:
            return reap.done(self._one_pass())

    def _one_pass(self) -> ReapReport:
        report = ReapReport(dry_run=self.dry_run)
        self._evict_expired(report)
        if self.local_pids:
            self._free_dead_local(report)
        if not self.backend.features.can_take_over:
            return report  # holders with an intent wait for a store that can hand them to a recovery
        for records in _by_holder(
            self.backend.expired_with_intent(namespace=self.namespace, grace=self.grace + self.backend.lock_delay)
        ).values():
            self._guarded(records, report, lambda records=records: self._recover(records, report, require_expired=True))
        return report

    def recover(self, records: Sequence[HolderRecord], *, require_expired: bool = False) -> ReapReport:
        """Recover one holder now (the admin's "recover now"): run its handler under a take-over, then release it.

        Without ``require_expired`` a live holder is taken too, but only if it is
        still as ``records`` show it (same owner and lease).
        """
        report = ReapReport(dry_run=self.dry_run)
        self._guarded(
            list(records),
            report,
            lambda: self._recover(list(records), report, require_expired=require_expired, require_unchanged=True),
        )
        return report

    def _guarded(self, records: list[HolderRecord], report: ReapReport, work: Callable[[], None]) -> None:
        """Run one holder's work; a failure is that holder's (reported, logged), never the pass's."""
        try:
            work()
        except Exception as e:  # one holder's failure never stops the pass
            main = main_record(records)
            logger.exception("reaping holder %s of %s failed", main.holder_id, main.node)
            report.failed.append({"holder": main.as_dict(), "token": None, "error": _error(e)})

    def _evict_expired(self, report: ReapReport) -> None:
        report.evicted = self.backend.evict_expired(
            namespace=self.namespace,
            grace=self.grace + self.backend.lock_delay,  # a holder in its lock delay still blocks: it stays
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
        host, pidns = socket.gethostname(), pid_namespace()
        dead = [
            r for r in self._all_holders() if not r.recovery and process_is_gone(dict(r.owner), host=host, pidns=pidns)
        ]
        for records in _by_holder(dead).values():
            self._guarded(records, report, lambda records=records: self._free_dead(records, report))
        self.progress("dead_local", len(report.dead_local))

    def _free_dead(self, records: list[HolderRecord], report: ReapReport) -> None:
        """Free the holder of a dead local process, if it is still as listed (else it lives on: leave it)."""
        if any(r.intent for r in records):
            self._recover(records, report, require_expired=False, require_unchanged=True)
            return
        if self.dry_run or self._free_listed(records, report, "its process is gone"):
            report.dead_local.extend(records)

    def _free_remnants(self, records: list[HolderRecord], report: ReapReport) -> None:
        """Free a holder whose main node (the one that keeps its intent) is gone: only its intention entries are left.

        A release or a recovery gives back the main node with the others, after
        the work the intent describes; one applied in part (a store that failed
        halfway) can leave the intention entries, which block as an intent's
        holder does but name no intent to recover: they would stay forever.
        """
        if self.dry_run or self._free_listed(records, report, "its main node was released already"):
            report.evicted.extend(records)

    def _free_listed(self, records: list[HolderRecord], report: ReapReport, why: str) -> bool:
        """Release the holder of ``records`` if it is still as listed, telling why; False (reported) if it changed."""
        if not release_if_unchanged(self.backend, records):
            report.changed.append(main_record(records))
            return False
        for record in records:
            logger.info("freed holder %s of %s: %s", record.holder_id, record.node, why)
            signals.send(signals.lock_reaped, sender=type(self), holder=record)
        return True

    def _recover(
        self,
        records: list[HolderRecord],
        report: ReapReport,
        *,
        require_expired: bool,
        require_unchanged: bool = False,
    ) -> None:
        main = main_record(records)
        if not is_grant(main.mode):
            self._free_remnants(records, report)
            return
        intent = dict(main.intent or {})
        previous = dict(main.recovery or {})
        done = previous.get("state") == DONE
        handler = get_handler(intent.get("op"))
        if handler is None and not done:
            report.unrecoverable.append(main)
            logger.error("holder %s of %s has intent %r but no recovery handler", main.holder_id, main.node, intent)
            signals.send(signals.lock_unrecoverable, sender=type(self), holder=main)
            return
        if self.dry_run:
            report.to_recover.append(main)
            return
        attempts = int(previous.get("attempts", 0)) + (0 if done else 1)
        owner = Owner.current()
        state = {"state": DONE if done else RECOVERING, "attempts": attempts, "reaper": owner.as_dict()}
        started = time.monotonic()
        # The conditional take-over is the "recovering" mark: of several reapers exactly one gets it.
        grant = self.backend.take_over(
            records,
            owner,
            ttl=self.backend.ttl,
            recovery=state,
            require_expired=require_expired,
            require_unchanged=require_unchanged,
        )
        if grant is None:
            (report.changed if require_unchanged else report.taken_by_other_reaper).append(main)
            return
        lock = Lock.adopt(grant, self.backend, started=started)
        entry = {"holder": main.as_dict(), "token": grant.token, "attempts": attempts}
        if done:
            # Its handler finished on an earlier pass, whose release failed: only the release is left.
            self._release(lock, main, entry, report)
            report.finished.append(entry)
            logger.info("released %s (%s), recovered earlier", main.node, intent.get("op"))
            return
        assert handler is not None
        try:
            handler(intent=intent, checkpoint=main.checkpoint, lock=lock)
        except Exception as e:  # any handler failure is recorded, and retried next run
            error = _error(e)
            logger.exception("recovery of %s (%s) failed", main.node, intent.get("op"))
            lock.abandon(recovery={"state": FAILED, "attempts": attempts, "error": error})
            report.failed.append({**entry, "error": error})
            signals.send(signals.lock_recovery_failed, sender=type(self), holder=main, error=error)
            return
        # Done, before the release: if the release fails, a rerun finds "done" and only releases.
        if not self.backend.renew(grant, recovery={**state, "state": DONE}):
            lock.abandon()
            error = "the holder was lost while its handler ran (lease ran out or taken over): it may run again"
            report.failed.append({**entry, "error": error})
            logger.error("recovery of %s (%s): %s", main.node, intent.get("op"), error)
            return
        self._release(lock, main, entry, report)
        report.recovered.append(entry)
        # Its line ("recovered holder ..."), with the holder's fields, is logged by a receiver of this signal.
        signals.send(signals.lock_recovered, sender=type(self), holder=main, lock=lock)

    def _release(self, lock: Lock, main: HolderRecord, entry: dict[str, Any], report: ReapReport) -> None:
        """Release a recovered holder; a failure leaves it ``done`` to its lease (the next pass releases it)."""
        try:
            lock.release()
        except Exception:
            lock.abandon()
            raise
