"""manage.py lock_bench: measure the lock stores, every figure next to a baseline from the same run."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...bench.common import format_facts, format_table
from ...bench.suite import OTHER_STORES, STAGES, STORES, Options, dashboard, run
from ...redaction import redact
from ..arguments import positive

QUICK = {
    "seconds": 0.2,
    "wake_rounds": 5,
    "request_rounds": 3,
    "reap_count": 200,
    "admin_count": 1000,
    "waiting_count": 150,
    "graph_sizes": (100, 1000),
    "deadlock_rounds": 3,
    "deadlock_timeout": 0.2,
}
"""``--quick``: enough of every figure to prove the command works (CI), too little to mean anything."""

MAX_DEPTH = 64  # the longest path a lock takes (paths.py)


def _stages(value: str) -> tuple[str, ...]:
    stages = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    if not stages or set(stages) - set(STAGES):
        raise ValueError(value)
    return stages


def _depths(value: str) -> tuple[int, ...]:
    depths = tuple(sorted({int(part) for part in value.split(",") if part.strip()}))
    if not depths or depths[0] < 1 or depths[-1] > MAX_DEPTH:
        raise ValueError(value)
    return depths


class Command(BaseCommand):
    help = (
        "Benchmark the lock stores (a throwaway Elasticsearch index, PostgreSQL database or SQLite file): "
        "tree lock pairs/s by depth against raw store operations, requests per acquire, wake-up latency, "
        "contention, writer wait, deadlock detection latency, reaping, the admin changelist, the wait-for graph of "
        "100 to 10,000 waiting requests and the admin waiting page over 1,000, and the async API "
        "(1 task, many tasks, wake-up); "
        "one table of figures and baselines."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            choices=[*STORES, *OTHER_STORES, "all"],
            default="all",
            help=f"Store(s) to measure; all: {', '.join(STORES)} (default).",
        )
        parser.add_argument(
            "--seconds",
            type=positive(float),
            help="Seconds each timed operation runs (default 3; 0.2 with --quick).",
        )
        parser.add_argument("--workers", type=positive(int), default=8, help="Contending processes (default 8).")
        parser.add_argument(
            "--depth", type=_depths, default=(1, 4, 16), metavar="D,D,...", help="Tree depths (default 1,4,16)."
        )
        parser.add_argument(
            "--tasks", type=positive(int), default=100, help="Tasks of one process in the async figure (default 100)."
        )
        parser.add_argument(
            "--deadlock-timeout",
            type=positive(float),
            metavar="SECONDS",
            help="Deadlock timeout of the deadlock detection figure (default 1, as the setting; 0.2 with --quick).",
        )
        parser.add_argument(
            "--deadlock-rounds",
            type=positive(int),
            metavar="N",
            help="Deadlocks to measure in the deadlock detection figure (default 20; 3 with --quick).",
        )
        parser.add_argument(
            "--only",
            type=_stages,
            default=STAGES,
            metavar="STAGE,...",
            help=f"Measure only these figures: {', '.join(STAGES)} (default: all; graph needs no store).",
        )
        parser.add_argument("--quick", action="store_true", help="A few seconds in all, for CI; figures mean little.")
        parser.add_argument(
            "--peers",
            action="store_true",
            help="Also measure the locks users would otherwise pick (tooz's PostgreSQL driver, python-redis-lock "
            "on 127.0.0.1:6379 or REDIS_URL; pip install 'django-esdlock[bench]'); skipped with a line when missing.",
        )
        parser.add_argument("--json", action="store_true", help="Print the figures as JSON instead of a table.")
        parser.add_argument("--plot", metavar="PNG", help="Also draw the figures into this PNG (needs matplotlib).")
        parser.add_argument(
            "--dashboard",
            metavar="PNG",
            help="Measure nothing else: run a mixed workload (waits, timeouts, renewals, a loss) on the first store "
            "for --seconds (default 60) with the metrics on, and draw the dashboard's panels from them into PNG "
            "(needs prometheus-client and matplotlib).",
        )
        parser.add_argument("--es-url", help="Elasticsearch URL (default ELASTICSEARCH_URL, else a local noida-db).")
        parser.add_argument(
            "--es-hosts",
            metavar="URL,URL,...",
            help="Measure only the scale-out figure on this Elasticsearch cluster: pairs/s of --workers processes, "
            "each on a namespace of its own, with 1 and with 3 lock indices.",
        )
        parser.add_argument(
            "--database-url",
            help="PostgreSQL server URL; a throwaway database is created there "
            "(default DATABASE_URL, else postgres://postgres@127.0.0.1:5432/test).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["plot"]:
            try:
                import matplotlib  # noqa: F401 - fail before minutes of measuring, not after
            except ImportError as e:
                raise CommandError("--plot needs matplotlib: pip install matplotlib") from e
        sizes = dict(QUICK) if options["quick"] else {}
        if options["dashboard"]:
            self._dashboard(options)
            return
        if options["es_hosts"]:
            self._scale_out(options, sizes)
            return
        for option in ("seconds", "deadlock_timeout", "deadlock_rounds"):
            if options[option] is not None:
                sizes[option] = options[option]
        bench_options = Options(
            stores=STORES if options["backend"] == "all" else (options["backend"],),
            workers=options["workers"],
            tasks=options["tasks"],
            depths=options["depth"],
            es_url=options["es_url"],
            database_url=options["database_url"],
            peers=options["peers"],
            only=options["only"],
            **sizes,
        )
        verbose = options["verbosity"] >= 1

        def say(message: str) -> None:
            if verbose:
                self.stderr.write(message)

        try:
            report = run(bench_options, say)
        except RuntimeError as e:
            raise CommandError(redact(e)) from e
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2, ensure_ascii=False, allow_nan=False))
        else:
            self.stdout.write(format_table(report.figures))
            self.stdout.write(redact(f"\nmachine: {format_facts(report.facts)}"))
            for error in report.errors:
                self.stdout.write(
                    self.style.ERROR(redact(f"{error['store']} {error['stage']} failed: {error['error']}"))
                )
        if options["plot"]:
            from ...bench.plot import plot

            plot(report, options["plot"])
            say(f"wrote {options['plot']}")
        if report.errors:
            raise CommandError(f"{len(report.errors)} figure(s) could not be measured; see above")

    def _dashboard(self, options: dict[str, Any]) -> None:
        try:
            import matplotlib  # noqa: F401
            import prometheus_client  # noqa: F401
        except ImportError as e:
            raise CommandError(f"--dashboard needs prometheus-client and matplotlib: {e}") from e
        seconds = options["seconds"] or (5.0 if options["quick"] else 60.0)
        stores = STORES if options["backend"] == "all" else (options["backend"],)
        bench_options = Options(stores=stores, es_url=options["es_url"], database_url=options["database_url"])
        dashboard(
            bench_options,
            options["dashboard"],
            seconds,
            self.stderr.write if options["verbosity"] else lambda message: None,
        )
        self.stdout.write(f"wrote {options['dashboard']}")

    def _scale_out(self, options: dict[str, Any], sizes: dict[str, Any]) -> None:
        from ...bench.cluster import scale_out

        hosts = [h for h in options["es_hosts"].split(",") if h]
        seconds = options["seconds"] or sizes.get("seconds", 3.0)
        say = self.stderr.write if options["verbosity"] >= 1 else lambda message: None
        figures = scale_out(hosts, workers=options["workers"], seconds=seconds, say=say)
        if options["json"]:
            self.stdout.write(json.dumps(figures, indent=2))
            return
        for figure in figures:
            self.stdout.write(
                f"{figure['indices']} lock index(es), {figure['workers']} processes on distinct namespaces: "
                f"{figure['pairs_per_s']:.0f} pairs/s (primaries on {', '.join(figure['primaries_on'])})"
            )
