"""manage.py reap_locks: remove dead holders and recover their half-done changes."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import get_backend
from ...exceptions import LockError
from ...paths import normalize_namespace
from ...reaper import Reaper
from ...waiting import SHOWN, WaitGraph, owner_label


def _limit(value: str) -> int:
    count = int(value)
    if count < 0:
        raise ValueError(value)
    return count


def _grace(value: str) -> float:
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(value)
    return seconds


@dataclasses.dataclass(frozen=True)
class _Waiting:
    """The wait-for graph as read after reaping, or why there is none."""

    graph: WaitGraph | None
    supported: bool = True
    error: str | None = None


class Command(BaseCommand):
    help = (
        "Remove lock holders whose lease ran out (by the store's clock) and nodes left empty; "
        "recover expired holders that carry an intent with their registered handler; "
        "report the requests waiting now and the deadlocks among them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Report what would be done; change nothing.")
        parser.add_argument("--json", action="store_true", help="Print a machine-readable report.")
        parser.add_argument("--namespace", help="Only this lock namespace.")
        parser.add_argument(
            "--grace",
            type=_grace,
            default=0.0,
            metavar="SECONDS",
            help="Only holders expired for longer than this (default 0).",
        )
        parser.add_argument(
            "--waiting-limit",
            type=_limit,
            default=SHOWN,
            metavar="N",
            help=f"Show at most N waiting requests, wait-for edges and deadlocks each, and count the rest "
            f"(default {SHOWN}; 0: all of them).",
        )
        parser.add_argument(
            "--local-pids",
            action="store_true",
            help="Also free holders owned by processes of this host that are provably gone.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options["verbosity"]
        namespace = options["namespace"]
        if namespace is not None:
            try:
                namespace = normalize_namespace(namespace)
            except LockError as e:
                raise CommandError(str(e)) from e

        def progress(stage: str, count: int) -> None:
            if verbosity >= 2 and not options["json"]:
                self.stderr.write(f"{stage}: {count} holders")

        reaper = Reaper(
            get_backend(),
            namespace=namespace,
            grace=options["grace"],
            dry_run=options["dry_run"],
            local_pids=options["local_pids"],
            progress=progress,
        )
        try:
            report = reaper.run()
        except LockError as e:
            raise CommandError(f"reaping failed: {e}") from e
        if not options["json"] and verbosity < 1:
            return
        waiting = self._waiting(reaper.backend, namespace)
        limit = options["waiting_limit"] or None
        if options["json"]:
            output = report.as_dict()
            graph = waiting.graph or WaitGraph((), (), (), {})
            output["waiting"] = {"supported": waiting.supported, "error": waiting.error, **graph.as_dict(limit)}
            counts = graph.counts(limit)
            output["counts"].update(counts)
            output["waiting_limit"] = limit
            output["waiting_truncated"] = any(
                counts[f"{what}_shown"] < counts[what] for what in ("waiting_requests", "waiting_edges", "cycles")
            )
            self.stdout.write(json.dumps(output, indent=2, sort_keys=True))
            return
        verb = "Would remove" if report.dry_run else "Removed"
        self.stdout.write(f"{verb} {len(report.evicted)} expired holder(s).")
        if options["local_pids"]:
            self.stdout.write(f"{verb} {len(report.dead_local)} holder(s) of dead local processes.")
        if report.to_recover:
            self.stdout.write(f"Would recover {len(report.to_recover)} holder(s) with an intent.")
        if report.recovered:
            self.stdout.write(self.style.SUCCESS(f"Recovered {len(report.recovered)} holder(s) with an intent."))
        if report.finished:
            self.stdout.write(
                f"Released {len(report.finished)} holder(s) recovered on an earlier run (handler not run again)."
            )
        for failure in report.failed:
            holder = failure["holder"]
            self.stdout.write(self.style.ERROR(f"Reaping {holder['path']} failed: {failure['error']}"))
        for record in report.changed:
            self.stdout.write(f"Left {record.node} held: its holder changed since it was listed (renewed or claimed).")
        for record in report.unrecoverable:
            self.stdout.write(
                self.style.WARNING(
                    f"No recovery handler for op {record.intent.get('op')!r} of {record.node}; left held."
                )
            )
        if verbosity >= 2:
            for record in report.evicted + report.dead_local:
                self.stdout.write(f"  {record.node} {record.mode} holder {record.holder_id} owner {dict(record.owner)}")
        self._write_waiting(waiting, verbosity, limit)

    def _waiting(self, backend: Any, namespace: str | None) -> _Waiting:
        """Read the wait-for graph now. Reaping is done by then: a failure here is reported, not raised."""
        if not backend.features.can_list_waiting:
            return _Waiting(None, supported=False, error=f"{type(backend).__name__} cannot list waiting requests")
        try:
            return _Waiting(WaitGraph.of(backend.wait_state(), namespace))
        except LockError as e:
            return _Waiting(None, error=f"reading the waiting requests failed: {e}")

    def _write_waiting(self, waiting: _Waiting, verbosity: int, limit: int | None) -> None:
        graph = waiting.graph
        if graph is None:
            if waiting.supported:
                self.stdout.write(self.style.ERROR(f"Reaped, but {waiting.error}"))
            elif verbosity >= 2:
                self.stdout.write(f"This lock store cannot list waiting requests ({waiting.error}).")
            return
        if not graph.requests:
            return
        self.stdout.write(
            f"{len(graph.requests)} request(s) waiting, {len(graph.edges)} wait-for edge(s), "
            f"{len(graph.cycles)} deadlock(s)."
        )
        for cycle in graph.cycles[:limit]:
            victim = cycle.victim
            self.stdout.write(
                self.style.WARNING(
                    f"Deadlock between {len(cycle.requests)} requests, victim {victim.holder_id} of "
                    f"{owner_label(victim.owner)}: {cycle.describe()}"
                )
            )
        self._write_rest(len(graph.cycles), limit, "deadlock(s)")
        if verbosity >= 2:
            for edge in graph.edges[:limit]:
                what = "queued behind waiting request" if edge.queued else "held by"
                self.stdout.write(
                    f"  {edge.waiter} waits for {edge.mode} on {edge.node}, {what} {edge.blocker} "
                    f"({edge.blocker_mode}, owner {graph.blocker_label(edge)})"
                )
            self._write_rest(len(graph.edges), limit, "wait-for edge(s)")

    def _write_rest(self, count: int, limit: int | None, what: str) -> None:
        if limit is not None and count > limit:
            self.stdout.write(f"... and {count - limit} more {what} not shown (--waiting-limit {limit}; 0 for all).")
