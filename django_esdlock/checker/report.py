"""What a lock_check run found, and how it reads: a progress line, a summary table, each violation's slice."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .checker import CHECKS, Violation, summarize
from .faults import FAULTS
from .options import CheckOptions


@dataclasses.dataclass
class CheckResult:
    """What a run did and found."""

    backend: str
    namespace: str
    global_name: str
    seed: int
    options: CheckOptions
    skipped: dict[str, str]
    events: list[dict[str, Any]]
    violations: list[Violation]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def summary(self) -> dict[str, Any]:
        return summarize(self.events)

    def report(self) -> str:
        """The summary table and, if any, each violation with its slice of history."""
        return summary_table(self) + ("\n" + violation_text(self) if self.violations else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "backend": self.backend,
            "namespace": self.namespace,
            "global_lock": self.global_name,
            "seed": self.seed,
            "processes": self.options.processes,
            "seconds": self.options.seconds,
            "ttl": self.options.ttl,
            "slack": self.options.slack,
            "faults": list(self.options.faults),
            "failover_restart": self.options.failover_restart,
            "failover_kill": self.options.failover_kill,
            "skipped_faults": self.skipped,
            "summary": self.summary,
            "violations": [v.as_dict() for v in self.violations],
            "wall_seconds": round(self.seconds, 3),
        }


BAR = 30


def progress_line(state: dict[str, Any]) -> str:
    done = int(BAR * state["elapsed"] / state["seconds"]) if state["seconds"] else BAR
    return (
        f"[{'#' * done}{'.' * (BAR - done)}] {state['elapsed']:5.1f}/{state['seconds']:g}s  "
        f"ops {state['operations']}  grants {state['grants']}  faults {state['faults']}  lost {state['lost']}"
    )


def summary_table(result: CheckResult) -> str:
    s = result.summary
    faults = s["faults"]
    outcomes = s["outcomes"]
    rows = [
        ("store", result.backend),
        ("namespace", f"{result.namespace} (and global lock {result.global_name!r})"),
        (
            "run",
            f"{result.options.processes} processes, {result.options.seconds:g}s, lease {result.options.ttl:g}s, "
            f"slack {result.options.slack:g}s, seed {result.seed}",
        ),
        ("operations", str(s["operations"])),
        ("  granted", str(s["grants"])),
        *((f"  {name}", _outcome(name, n, s)) for name, n in outcomes.items() if name != "granted"),
        ("writes under locks", f"{s['writes']} ({s['late_writes']} late writes after a loss, fenced off)"),
        (
            "intents",
            f"{s['intents']} ({s['recovered']} recovered by the reaper; "
            f"{s['reaper_passes_failed']} reaper passes failed on the store)",
        ),
        *(
            (f"semaphore {name}", f"{sem['grants']} grants, at most {sem['most_at_once']} at once of {sem['limit']}")
            for name, sem in s.get("semaphores", {}).items()
        ),
        (
            "faults injected",
            ", ".join(_injected(name, faults[name], s) for name in FAULTS if name in result.options.faults) or "none",
        ),
        *((f"  {name}", f"skipped: {why}") for name, why in result.skipped.items()),
        ("  kills of intent holders", str(s["kills_holding_intent"])) if "kill" in result.options.faults else None,
        ("  nodes killed", _nodes_killed(s)) if s["nodes_killed"] or s["failover_problems"] else None,
        ("  store commands", f"PROBLEMS: {'; '.join(s['store_command_problems'])}")
        if s.get("store_command_problems")
        else None,
        ("locks lost", f"{s['locks_lost']}, each told to its holder (lock.lost / LockLost)"),
        ("left held after reap", str(s["leftovers"])),
        (f"guarded data ({result.options.guarded})", _guarded(s["guarded"])) if result.options.guarded else None,
        ("violations", str(len(result.violations))),
    ]
    rows = [row for row in rows if row is not None]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _injected(name: str, count: int, s: dict[str, Any]) -> str:
    """``pause 3 (8.1 s)``: how many times a fault was injected, and for how long in all (a kill has no length)."""
    seconds = s.get("fault_seconds", {}).get(name)
    return f"{name} {count}" + (f" ({seconds:.1f} s)" if count and seconds else "")


def _outcome(name: str, count: int, s: dict[str, Any]) -> str:
    if name != "deadlock":
        return str(count)
    cycles = s.get("deadlock_cycles", 0)
    return f"{count} ({cycles} victims of a cycle between owners, {count - cycles} would have waited for themselves)"


def _nodes_killed(s: dict[str, Any]) -> str:
    killed = ", ".join(s["nodes_killed"]) or "none"
    if s["failover_problems"]:
        return f"{killed}; PROBLEMS: {'; '.join(s['failover_problems'])}"
    return f"{killed}; each restarted, the cluster whole again"


def format_event(event: dict[str, Any], origin: float) -> str:
    skip = {"t", "wall", "process", "type"}
    fields = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in event.items() if k not in skip)
    return f"  {event['t'] - origin:9.3f}s  {event['process']:<8} {event['type']:<10} {fields}"


def violation_text(result: CheckResult, limit: int = 10) -> str:
    """The first ``limit`` violations, each with its minimal slice of history."""
    origin = result.events[0]["t"] if result.events else 0.0
    lines = []
    for violation in result.violations[:limit]:
        lines.append(f"VIOLATION ({violation.check}) {CHECKS[violation.check]}: {violation.message}")
        lines.extend(format_event(e, origin) for e in violation.events)
    if len(result.violations) > limit:
        lines.append(f"... and {len(result.violations) - limit} more (--json or --history for all)")
    return "\n".join(lines)


def _guarded(counts: dict[str, int]) -> str:
    """The appends to the guarded data by how they ended, the late ones (of holders told of their loss) apart."""
    on_time = {k: n for k, n in counts.items() if not k.startswith("late_")}
    late = {k.removeprefix("late_"): n for k, n in counts.items() if k.startswith("late_")}
    words = {"ok": "written", "stale": "refused by a newer fence", "changed": "refused, the list changed",
             "lost": "not sent, lock lost", "error": "failed"}  # fmt: skip

    def said(part: dict[str, int]) -> str:
        return ", ".join(f"{n} {words.get(k, k)}" for k, n in part.items()) or "none"

    return f"appends: {said(on_time)}; late appends: {said(late)}"
