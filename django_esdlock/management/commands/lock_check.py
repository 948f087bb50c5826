"""manage.py lock_check: prove on your own store that its locks exclude, under pauses, kills, cuts and failovers."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...checker.checker import DEFAULT_SLACK
from ...checker.failover import DEFAULT_KILL
from ...checker.faults import FAULTS
from ...checker.guarded import MODES as GUARDED_MODES
from ...exceptions import LockError
from ...redaction import redact, redact_data
from ..arguments import positive


def _faults(value: str) -> tuple[str, ...]:
    faults = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    if value.strip() in ("", "none"):
        return ()
    if set(faults) - set(FAULTS):
        raise ValueError(value)
    return faults


class Command(BaseCommand):
    help = (
        "Run a randomized, fault-injecting lock workload of real processes against the lock store "
        "(in a throwaway namespace) and check its history: no overlapping conflicting grants, fencing "
        "tokens in order, every request ends, nothing left held, no intent lost. Exit status 1 on a violation."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--processes", type=positive(int), default=8, help="Worker processes (default 8).")
        parser.add_argument("--seconds", type=positive(float), default=60.0, help="Length of the run (default 60).")
        parser.add_argument(
            "--faults",
            type=_faults,
            default=FAULTS,
            metavar=",".join(FAULTS),
            help="Faults to inject (default all that apply; 'none' for none).",
        )
        parser.add_argument(
            "--failover-restart",
            metavar="CMD",
            help="Shell command that starts a killed Elasticsearch node again, run in the background; "
            "{node} is its name, {node_number} the digits ending it, {pid} its process id, {host} its host. "
            "For ../shared/elasticsearch/start-cluster: 'PATH/start-cluster --node {node_number}'. "
            "Without it the failover fault is skipped.",
        )
        parser.add_argument(
            "--failover-kill",
            metavar="CMD",
            default=DEFAULT_KILL,
            help=f"Shell command that kills a node, same placeholders (default {DEFAULT_KILL!r}: "
            "SIGKILL of the pid the node reports, for nodes on this machine).",
        )
        parser.add_argument(
            "--store-restart",
            metavar="CMD",
            help="Shell command that restarts the store abruptly, run mid-run by the store-restart fault "
            "(for PostgreSQL e.g. 'pg_ctl restart -m immediate -D DATADIR'). Without it that fault is skipped.",
        )
        parser.add_argument(
            "--store-failover",
            metavar="CMD",
            help="Shell command that kills the store's primary and promotes a standby in its place, run mid-run by "
            "the store-failover fault (for PostgreSQL: pg_ctl stop -m immediate on the primary, pg_ctl promote on "
            "the standby; the clients reach the new primary through a multi-host URL). It returns once the new "
            "primary takes writes (and, for the next run of it, a new standby follows). Without it that fault "
            "is skipped.",
        )
        parser.add_argument(
            "--guarded-data",
            choices=GUARDED_MODES,
            help="Each exclusive grant also appends its operation id to a record of the store's data (a table of "
            "the run's own in the lock database, or an index on the Elasticsearch cluster), read-modify-write: "
            "'fenced' through the fencing helpers (the checker demands every acknowledged append kept, none "
            "refused kept, tokens never going down), 'plain' through plain updates (a control run: the checker "
            "should catch what it loses). Default: no data writes.",
        )
        parser.add_argument("--seed", type=int, help="Seed of the workload and the faults (default random).")
        parser.add_argument(
            "--ttl", type=positive(float), default=2.0, help="Lease of the workload's locks (default 2 s)."
        )
        parser.add_argument(
            "--slack",
            type=float,
            default=DEFAULT_SLACK,
            help=f"Seconds a request may run past its timeout before it counts as hung (default {DEFAULT_SLACK:g}).",
        )
        parser.add_argument(
            "--semaphores",
            type=float,
            default=0.1,
            help="Share of requests for the workload's semaphore of limit 2 (default 0.1; 0 for none).",
        )
        parser.add_argument("--backend-url", help="A lock store URL instead of LOCK_BACKEND (as the setting takes).")
        parser.add_argument(
            "--es-hosts",
            metavar="URL,URL,...",
            help="Check an Elasticsearch cluster of these hosts (index 'locks', or the --backend-url's).",
        )
        parser.add_argument("--json", action="store_true", help="Print the result as JSON (for CI).")
        parser.add_argument("--history", metavar="FILE", help="Write the recorded history (JSON lines) to FILE.")
        parser.add_argument("--plot", metavar="PNG", help="Draw a timeline of the holds and faults (needs matplotlib).")
        parser.add_argument(
            "--replay", metavar="FILE", help="Check a history written by --history instead of running a workload."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from ...checker import CheckOptions, run_check
        from ...checker.history import load_history
        from ...checker.report import progress_line, summary_table, violation_text

        if options["plot"]:
            try:
                import matplotlib  # noqa: F401 - fail before the run, not after
            except ImportError as e:
                raise CommandError("--plot needs matplotlib: pip install matplotlib") from e
        try:
            check_options = CheckOptions(
                processes=options["processes"],
                seconds=options["seconds"],
                faults=options["faults"],
                seed=options["seed"],
                ttl=options["ttl"],
                slack=options["slack"],
                failover_restart=options["failover_restart"],
                failover_kill=options["failover_kill"],
                store_restart=options["store_restart"],
                store_failover=options["store_failover"],
                guarded=options["guarded_data"],
                semaphores=options["semaphores"],
            )
            config = _config(options["backend_url"], options["es_hosts"])
        except ValueError as e:
            raise CommandError(redact(e)) from e
        verbose = options["verbosity"] >= 1 and not options["json"]
        tty = self.stderr.isatty()
        last = [0.0]

        def progress(state: dict[str, Any]) -> None:
            if not verbose:
                return
            if state.get("done"):
                if tty:
                    self.stderr.write("")
                return
            if tty:
                self.stderr.write("\r" + redact(progress_line(state)), ending="")
                self.stderr.flush()
            elif state["elapsed"] - last[0] >= 10:
                last[0] = state["elapsed"]
                self.stderr.write(redact(progress_line(state)))

        if options["replay"]:
            result = _replay(load_history(options["replay"]), check_options)
        else:
            try:
                result = run_check(config, check_options, progress=progress, history=options["history"])
            except (LockError, ImproperlyConfigured, RuntimeError) as e:
                raise CommandError(redact(f"lock_check could not run: {e}")) from e
        if options["json"]:
            self.stdout.write(json.dumps(redact_data(result.as_dict()), indent=2, ensure_ascii=False, default=str))
        else:
            self.stdout.write(redact(summary_table(result)))
            if result.violations:
                self.stdout.write(self.style.ERROR(redact(violation_text(result))))
            else:
                self.stdout.write(self.style.SUCCESS("0 violations"))
        if options["history"] and verbose:
            self.stderr.write(f"history written to {options['history']}")
        if options["plot"]:
            from ...checker.plot import plot

            plot(result, options["plot"])
            if verbose:
                self.stderr.write(f"plot written to {options['plot']}")
        if result.violations:
            raise CommandError(f"{len(result.violations)} violation(s): see above", returncode=1)
        problems = result.summary["store_command_problems"]
        if problems:  # the fault asked for was not (or not always) injected: the run does not show what it claims
            raise CommandError(redact(f"the store's command failed: {problems[0]}"), returncode=1)


def _config(url: str | None, es_hosts: str | None) -> Any:
    """The LOCK_BACKEND value to check: the URL's, or an Elasticsearch cluster's hosts (with the URL's index)."""
    if not es_hosts:
        return url
    from ...conf import ELASTICSEARCH_BACKEND, parse_url

    config = parse_url(url or "elasticsearch://localhost/locks")
    if config["BACKEND"] != ELASTICSEARCH_BACKEND:
        raise ValueError("--es-hosts takes an Elasticsearch --backend-url (for its index) or none")
    config["OPTIONS"]["hosts"] = [h.strip() for h in es_hosts.split(",") if h.strip()]
    return config


def _replay(events: list[dict[str, Any]], options: Any) -> Any:
    from ...checker import CheckResult
    from ...checker.checker import check_history

    start = next((e for e in events if e["type"] == "start"), {})
    return CheckResult(
        backend="(replayed history)",
        namespace=start.get("namespace", "?"),
        global_name=start.get("namespace", "?"),
        seed=start.get("seed", 0),
        options=options,
        skipped={},
        events=events,
        violations=check_history(events, slack=options.slack),
        seconds=0.0,
    )
