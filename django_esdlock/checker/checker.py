"""The checker: judges a lock_check history against the five claims a lock store must keep.

(a) No two conflicting grants overlap, and no more holders of a semaphore
    than its limit do: each holder's *span* runs from the
    return of its acquire to the last thing it did while ``lock.lost`` was
    still False (a write, its release call). A holder told of its loss may
    still write late; each such write must carry a smaller fencing token
    than every conflicting holder granted before it.
(b) Fencing tokens strictly increase in grant order per namespace: a grant
    whose acquire returned before another was asked for has the smaller token.
(c) Every request ends, as granted, LockTimeout, LockUnavailable,
    LockBackendUnavailable or LockDeadlock, within its timeout plus a stated
    slack (plus the time its own process was paused); LockDeadlock only for a
    request nested in a hold of its owner (one that holds nothing is in no
    cycle). Requests of killed processes are indeterminate, as Jepsen counts
    them.
(d) After the run and a reap, nothing of the workload is left held.
(e) No intent is lost: a holder killed mid-change is recovered by the reaper,
    which sees its latest checkpoint.
(f) With guarded data (see :mod:`.guarded`): every append the store
    acknowledged is in its record's final list exactly once, no refused one
    is, and along each list the appends' fencing tokens never go down.

Everything is judged on the history alone, so a recorded history can be
checked again (``lock_check --replay FILE``).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from typing import Any

from ..modes import Mode, compatible
from .history import OUTCOMES, Operation, operations

CHECKS = {
    "a": "conflicting grants overlap (or more than a semaphore's limit)",
    "b": "fencing tokens out of grant order",
    "c": "a request did not end in time, or ended wrongly",
    "d": "left held after the run and a reap",
    "e": "intent lost",
    "f": "guarded data lost, kept when refused, or written by an older token after a newer one",
}

DEFAULT_SLACK = 10.0
"""Seconds a request may run past its timeout (store round trips, a loaded machine) before (c) calls it hung."""


@dataclasses.dataclass
class Violation:
    """One broken claim and the smallest slice of history that shows it."""

    check: str
    message: str
    events: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "claim": CHECKS[self.check], "message": self.message, "events": self.events}


NODE_EVENTS = ("node_kill", "node_restart", "node_restarted", "cluster_whole")
"""The failover fault's events: an Elasticsearch node killed, its restart started and ended, the cluster whole."""
LINK_EVENTS = ("blackhole", "flow", "latency", "latency_end")
"""The black-hole and latency faults' events: each begins and ends a span."""
STORE_COMMAND_EVENTS = ("store_restart", "store_restarted", "store_failover", "store_failed_over")
"""The store-restart and store-failover faults' events: the user's command began, and ended."""
STORE_COMMAND_FAULTS = ("store-restart", "store-failover")
"""The faults that run a shell command of the user's (``--store-restart CMD``, ``--store-failover CMD``)."""
STORE_EVENTS = ("cut", "restore", *NODE_EVENTS, *LINK_EVENTS, *STORE_COMMAND_EVENTS, "clock", "clock_end")
"""Fault events that touch every process: the store's, and the clock fault (it sets every worker's clock off)."""

FAULT_SPANS = {
    "pause": ("pause", "resume"),
    "store": ("cut", "restore"),
    "blackhole": ("blackhole", "flow"),
    "latency": ("latency", "latency_end"),
    "clock": ("clock", "clock_end"),
    "store-restart": ("store_restart", "store_restarted"),
    "store-failover": ("store_failover", "store_failed_over"),
    "failover": ("node_kill", "node_restarted"),
}
"""Each fault (as ``--faults`` names it) and the events that begin and end one injection of it."""


@dataclasses.dataclass
class Faults:
    """The faults of the history, by process."""

    pauses: dict[str, list[tuple[float, float]]]
    kills: dict[str, float]
    hung: dict[str, float]
    nemesis: list[dict[str, Any]]
    exits: list[dict[str, Any]]

    @classmethod
    def of(cls, events: list[dict[str, Any]]) -> Faults:
        pauses: dict[str, list[tuple[float, float]]] = defaultdict(list)
        started: dict[str, float] = {}
        kills: dict[str, float] = {}
        hung: dict[str, float] = {}
        nemesis = []
        exits = []
        for e in events:
            kind = e["type"]
            if kind in ("pause", "resume", "kill", *STORE_EVENTS):
                nemesis.append(e)
            if kind == "pause":
                started[e["victim"]] = e["t"]
            elif kind == "resume":
                pauses[e["victim"]].append((started.pop(e["victim"], e["t"]), e["t"]))
            elif kind == "kill":
                kills[e["victim"]] = e["t"]
            elif kind == "exit":
                exits.append(e)
                if e.get("how") == "hung":
                    hung[e["victim"]] = e["t"]
        for victim, since in started.items():  # paused to the end
            pauses[victim].append((since, float("inf")))
        return cls(dict(pauses), kills, hung, nemesis, exits)

    def paused_within(self, process: str, start: float, end: float) -> float:
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b in self.pauses.get(process, ()))

    def around(self, start: float, end: float, processes: set[str]) -> list[dict[str, Any]]:
        """Fault events in [start, end] that touch ``processes`` (or every process: the store)."""
        return [
            e
            for e in self.nemesis
            if start <= e["t"] <= end and (e.get("victim") in processes or e["type"] in STORE_EVENTS)
        ]


def _grant_nodes(op: Operation) -> list[tuple[tuple[str, str, str], Mode]]:
    return [((ns, kind, key), Mode(mode)) for ns, kind, key, mode in op.nodes]


def _slice(*parts: Any) -> list[dict[str, Any]]:
    seen: dict[int, dict[str, Any]] = {}
    for part in parts:
        for event in part if isinstance(part, list) else [part]:
            if event is not None:
                seen[id(event)] = event
    return sorted(seen.values(), key=lambda e: e["t"])


def _span_event(op: Operation) -> dict[str, Any]:
    """The event at which ``op``'s span ends."""
    end = op.span_end
    return next((e for e in op.events if e["t"] == end), op.done)  # type: ignore[arg-type]


def check_overlaps(ops: dict[str, Operation], faults: Faults) -> list[Violation]:
    """(a) over every node: conflicting spans must not overlap; late writes must be fenced off."""
    per_node: dict[tuple[str, str, str], list[tuple[float, float, Operation, Mode]]] = defaultdict(list)
    for op in ops.values():
        if op.granted:
            for node, mode in _grant_nodes(op):
                per_node[node].append((op.done["t"], op.span_end, op, mode))  # type: ignore[index]
    violations: list[Violation] = []
    reported: set[tuple[str, str]] = set()
    for node, entries in per_node.items():
        entries.sort(key=lambda entry: entry[0])
        active: list[tuple[float, float, Operation, Mode]] = []
        for start, end, op, mode in entries:
            active = [a for a in active if a[1] > start]
            for _, a_end, a_op, a_mode in active:
                if a_op is op or compatible(a_mode, mode) or (a_op.op, op.op) in reported:
                    continue
                if start < min(a_end, end):
                    reported.add((a_op.op, op.op))
                    window = [w for w in a_op.writes if start <= w["t"] <= a_end]
                    violations.append(
                        Violation(
                            "a",
                            f"{a_op.op} held {node[0]}:{node[2]} in {a_mode} (token {a_op.token}) until "
                            f"{a_end - start:.3f}s after {op.op} was granted it in {mode} (token {op.token}), "
                            f"without having been told its lock was lost",
                            _slice(
                                a_op.invoke,
                                a_op.done,
                                window[:1],
                                _span_event(a_op),
                                a_op.lost,
                                op.invoke,
                                op.done,
                                faults.around(a_op.done["t"], a_end, {a_op.process, op.process}),  # type: ignore[index]
                            ),
                        )
                    )
            if end > start:
                active.append((start, end, op, mode))
        violations.extend(_check_fencing(node, entries, faults))
    return violations


def _semaphore_spans(ops: dict[str, Operation]) -> dict[tuple[str, str, str], list[tuple[float, float, Operation]]]:
    """The spans of each semaphore's grants, by node."""
    per_node: dict[tuple[str, str, str], list[tuple[float, float, Operation]]] = defaultdict(list)
    for op in ops.values():
        if op.granted and op.invoke.get("limit"):
            for node, _ in _grant_nodes(op):
                per_node[node].append((op.done["t"], op.span_end, op))  # type: ignore[index]
    return per_node


def most_at_once(spans: list[tuple[float, float, Any]]) -> int:
    """The most spans that overlap at one instant (one that ends as another starts does not overlap it)."""
    edges = sorted(
        [(start, 1) for start, end, _ in spans if end > start] + [(end, -1) for start, end, _ in spans if end > start]
    )
    at_once = most = 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    return most


def check_semaphores(ops: dict[str, Operation], faults: Faults) -> list[Violation]:
    """(a) on semaphores: never more spans at once than the limit the holders asked (one limit per run)."""
    per_node = _semaphore_spans(ops)
    violations = []
    for node, entries in per_node.items():
        entries.sort(key=lambda entry: entry[0])
        active: list[tuple[float, float, Operation]] = []
        for start, end, op in entries:
            active = [a for a in active if a[1] > start]
            limit = op.invoke["limit"]
            if end > start and len(active) >= limit:
                holders = ", ".join(f"{a.op} (token {a.token})" for _, _, a in active)
                violations.append(
                    Violation(
                        "a",
                        f"{op.op} was granted semaphore {node[0]}:{node[2]} of limit {limit} (token {op.token}) "
                        f"while {len(active)} held it, none told its lock was lost: {holders}",
                        _slice(
                            *[[a.done, _span_event(a)] for _, _, a in active],
                            op.invoke,
                            op.done,
                            faults.around(start, end, {op.process, *(a.process for _, _, a in active)}),
                        ),
                    )
                )
                break  # one report per semaphore: the first time it ran over
            if end > start:
                active.append((start, end, op))
    return violations


def _check_fencing(
    node: tuple[str, str, str], entries: list[tuple[float, float, Operation, Mode]], faults: Faults
) -> list[Violation]:
    """(a), its second half: a holder's writes after its loss carry a smaller token than later conflicting holders."""
    violations = []
    starts = [entry[0] for entry in entries]
    for start, _, op, mode in entries:
        stale = [w for w in op.writes if not w.get("valid")]
        for write in stale:
            for later_start, _, later, later_mode in entries[bisect.bisect_right(starts, start) :]:
                if later_start > write["t"]:
                    break
                if later is op or compatible(mode, later_mode):
                    continue
                if not (write["token"] < later.token):
                    violations.append(
                        Violation(
                            "a",
                            f"{op.op} wrote to {node[0]}:{node[2]} after losing its lock with token "
                            f"{write['token']}, not smaller than the token {later.token} of {later.op}, "
                            f"granted before that write: fencing would not refuse it",
                            _slice(op.done, op.lost, later.done, write),
                        )
                    )
                    break
    return violations


def check_tokens(ops: dict[str, Operation]) -> list[Violation]:
    """(b) per namespace: a grant returned before another was asked for has the smaller token."""
    violations = []
    by_namespace: dict[str, list[Operation]] = defaultdict(list)
    for op in ops.values():
        if op.granted:
            by_namespace[op.namespace].append(op)
    for grants in by_namespace.values():
        grants.sort(key=lambda op: op.done["t"])  # type: ignore[index]
        oks = [op.done["t"] for op in grants]  # type: ignore[index]
        best: list[Operation] = []  # best[i]: the largest token among grants[:i+1]
        for op in grants:
            best.append(op if not best or op.token > best[-1].token else best[-1])
        for op in grants:
            earlier = bisect.bisect_left(oks, op.invoke["t"])
            if earlier == 0:
                continue
            top = best[earlier - 1]
            if top.token >= op.token:
                violations.append(
                    Violation(
                        "b",
                        f"{op.op} got token {op.token} although {top.op} had already been granted "
                        f"token {top.token} in namespace {op.namespace} before {op.op} asked",
                        _slice(top.invoke, top.done, op.invoke, op.done),
                    )
                )
    return violations


def check_endings(ops: dict[str, Operation], faults: Faults, slack: float) -> list[Violation]:
    """(c) every request ends, in one of the four ways, within its timeout plus ``slack`` (plus its pauses)."""
    violations = [
        Violation("c", f"worker {e['victim']} died on its own (exit code {e.get('exitcode')})", [e])
        for e in faults.exits
        if e.get("how") == "crashed"
    ]
    for op in ops.values():
        if op.recovery:
            continue
        killed_at = faults.kills.get(op.process)
        start = op.invoke["t"]
        if op.done is None:
            if killed_at is not None and killed_at >= start:
                continue  # indeterminate: the process died with the request in flight
            how = "hung past the end of the run" if op.process in faults.hung else "never ended"
            violations.append(Violation("c", f"{op.op} {how} (timeout {op.invoke['timeout']}s)", [op.invoke]))
            continue
        outcome = "granted" if op.granted else op.done.get("outcome")
        if outcome not in OUTCOMES:
            violations.append(
                Violation("c", f"{op.op} ended with {outcome}: {op.done.get('error')}", _slice(op.invoke, op.done))
            )
            continue
        if outcome == "deadlock" and not op.invoke.get("outer"):
            violations.append(
                Violation("c", f"{op.op} got LockDeadlock while its owner held nothing", _slice(op.invoke, op.done))
            )
        took = op.done["t"] - start
        allowed = (op.invoke["timeout"] or 0.0) + slack + faults.paused_within(op.process, start, op.done["t"])
        if took > allowed:
            violations.append(
                Violation(
                    "c",
                    f"{op.op} took {took:.2f}s to end ({outcome}); its timeout was {op.invoke['timeout']}s "
                    f"(+{slack:g}s slack)",
                    _slice(op.invoke, op.done),
                )
            )
        if op.release is not None and op.released is None and not (killed_at and killed_at >= op.release["t"]):
            violations.append(Violation("c", f"the release of {op.op} never ended", _slice(op.done, op.release)))
        elif op.released is not None:
            took = op.released["t"] - op.release["t"]  # type: ignore[index]
            if took > slack + faults.paused_within(op.process, op.release["t"], op.released["t"]):  # type: ignore[index]
                violations.append(
                    Violation("c", f"the release of {op.op} took {took:.2f}s", _slice(op.release, op.released))
                )
    return violations


def check_leftovers(events: list[dict[str, Any]], ops: dict[str, Operation]) -> list[Violation]:
    """(d) what the command found held after the final reap."""
    by_holder = {op.done.get("holder"): op for op in ops.values() if op.granted}  # type: ignore[union-attr]
    violations = []
    for e in events:
        if e["type"] != "leftover":
            continue
        op = by_holder.get(e["holder"])
        what = f"{op.op}'s" if op else "an unknown"
        violations.append(
            Violation(
                "d",
                f"{what} holder {e['holder']} still holds {e['node']} in {e['mode']} after the run and a reap",
                _slice(op.invoke, op.done, op.release, op.released, e) if op else [e],
            )
        )
    return violations


def check_intents(events: list[dict[str, Any]], ops: dict[str, Operation], faults: Faults) -> list[Violation]:
    """(e) a holder killed mid-change is recovered, with its latest checkpoint."""
    recovered = {e["intent_op"]: e for e in events if e["type"] == "recovered"}
    violations = []
    for op in ops.values():
        if not (op.granted and op.has_intent) or op.recovery:
            continue
        killed_at = faults.kills.get(op.process)
        rec = recovered.get(op.op)
        if killed_at is not None and killed_at >= op.done["t"] and op.release is None and rec is None:  # type: ignore[index]
            violations.append(
                Violation(
                    "e",
                    f"{op.op} was killed holding intent {op.invoke['intent']} and no reaper recovered it",
                    _slice(op.invoke, op.done, op.checkpoints[-1:], [e for e in faults.nemesis if e["t"] == killed_at]),
                )
            )
            continue
        if rec is None:
            continue
        # At least every checkpoint recorded as done before the recovery (the holder records
        # it once the store answered); at most one the holder tried (it records each before
        # the call too: in flight at a kill, or its answer lost, it may have been stored).
        done_steps = [c["data"]["step"] for c in op.checkpoints if c.get("outcome") == "ok" and c["t"] < rec["t"]]
        tried_steps = [c["data"]["step"] for c in op.checkpoints] + [0]
        got = (rec.get("checkpoint") or {}).get("step", 0)
        if got < max(done_steps, default=0) or got > max(tried_steps):
            violations.append(
                Violation(
                    "e",
                    f"the recovery of {op.op} saw checkpoint step {got}; the holder had recorded "
                    f"{max(done_steps, default=0)}",
                    _slice(op.checkpoints[-2:], rec),
                )
            )
    return violations


def check_guarded(events: list[dict[str, Any]]) -> list[Violation]:
    """(f) over the guarded data's final lists (``data`` events) and the appends the workers recorded."""
    finals = {e["key"]: e for e in events if e["type"] == "data"}
    appends: dict[str, dict[str, Any]] = {e["item"]: e for e in events if e["type"] == "append"}
    violations: list[Violation] = []
    for key, final in finals.items():
        ops = final["ops"]
        for item, append in appends.items():
            if append["key"] != key:
                continue
            count = ops.count(item)
            if append["outcome"] == "ok" and count != 1:
                what = "lost (a later write overwrote it)" if count == 0 else f"in the list {count} times"
                violations.append(
                    Violation(
                        "f",
                        f"{key}: the acknowledged append {item} (token {append['token']}) is {what}",
                        _slice(append, final),
                    )
                )
            elif append["outcome"] in ("stale", "changed", "lost") and count:
                violations.append(
                    Violation(
                        "f",
                        f"{key}: the append {item} was refused ({append['outcome']}) yet is in the list",
                        _slice(append, final),
                    )
                )
        newest: dict[str, Any] | None = None
        for item in ops:
            append = appends.get(item)
            if append is None:
                continue
            if newest is not None and append["token"] < newest["token"]:
                violations.append(
                    Violation(
                        "f",
                        f"{key}: {item} (token {append['token']}) was appended after {newest['item']} "
                        f"(token {newest['token']})",
                        _slice(newest, append, final),
                    )
                )
            if newest is None or append["token"] > newest["token"]:
                newest = append
    return violations


def check_history(events: list[dict[str, Any]], *, slack: float = DEFAULT_SLACK) -> list[Violation]:
    """Return every violation of (a)-(f) that ``events`` shows, each with its slice of history."""
    ops = operations(events)
    faults = Faults.of(events)
    return [
        *check_overlaps(ops, faults),
        *check_semaphores(ops, faults),
        *check_tokens(ops),
        *check_endings(ops, faults, slack),
        *check_leftovers(events, ops),
        *check_intents(events, ops, faults),
        *check_guarded(events),
    ]


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Count what the history holds: operations, outcomes, grants, losses, late writes, faults, recoveries."""
    ops = operations(events)
    workload = [op for op in ops.values() if not op.recovery]
    outcomes: dict[str, int] = defaultdict(int)
    for op in workload:
        outcomes["granted" if op.granted else (op.done or {}).get("outcome", "indeterminate")] += 1
    lost = [op for op in workload if op.granted and op.lost is not None]
    faults, fault_seconds = _fault_counts(events)
    return {
        "operations": len(workload),
        "grants": sum(op.granted for op in workload),
        "outcomes": dict(sorted(outcomes.items())),
        "writes": sum(len(op.writes) for op in workload),
        "late_writes": sum(not w.get("valid") for op in workload for w in op.writes),
        "locks_lost": len(lost),
        "intents": sum(op.granted and op.has_intent for op in workload),
        "semaphores": {
            f"{node[0]}:{node[2]}": {
                "grants": len(spans),
                "limit": spans[0][2].invoke["limit"],
                "most_at_once": most_at_once(spans),
            }
            for node, spans in sorted(_semaphore_spans(ops).items())
        },
        "deadlock_cycles": sum(
            e["type"] == "fail" and e.get("outcome") == "deadlock" and bool(e.get("cycle")) for e in events
        ),
        "recovered": sum(e["type"] == "recovered" for e in events),
        "reaper_passes_failed": sum(e["type"] == "reap_failed" for e in events),
        "faults": faults,
        "fault_seconds": fault_seconds,
        "kills_holding_intent": sum(e["type"] == "kill" and e.get("holding") == 2 for e in events),
        "leftovers": sum(e["type"] == "leftover" for e in events),
        "guarded": _guarded_counts(events),
        "nodes_killed": [f"{e['node']} ({e['role']})" for e in events if e["type"] == "node_kill"],
        "failover_problems": [
            e.get("error") or f"{e['type']} {e.get('node', '')} {e.get('output', '')}".strip()
            for e in events
            if e["type"] in ("failover_error", "node_not_back", "cluster_not_whole")
            or (e["type"] == "node_restarted" and e.get("exitcode"))
        ],
        "store_command_problems": [
            f"{fault} command {_ended(e)}: {e.get('output') or 'no output'}"
            for fault in STORE_COMMAND_FAULTS
            for e in events
            if e["type"] == FAULT_SPANS[fault][1] and e.get("exitcode") != 0
        ],
    }


def _guarded_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    """How the appends to the guarded data ended (``late_``: those of holders told of their loss); {} without."""
    counts: dict[str, int] = defaultdict(int)
    for e in events:
        if e["type"] == "append":
            counts[("late_" if e.get("late") else "") + e["outcome"]] += 1
    return dict(sorted(counts.items()))


def _ended(event: dict[str, Any]) -> str:
    return "timed out" if event.get("exitcode") is None else f"exited {event['exitcode']}"


def _fault_counts(events: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, float]]:
    """Return how many times each fault was injected, and for how many seconds in all (a kill has no length)."""
    counts = {"kill": sum(e["type"] == "kill" for e in events)}
    seconds: dict[str, float] = {}
    end = events[-1]["t"] if events else 0.0
    for fault, (begins, ends) in FAULT_SPANS.items():
        open_at: dict[Any, float] = {}
        counts[fault], total = 0, 0.0
        for e in events:
            key = e.get("victim") or e.get("node")
            if e["type"] == begins:
                counts[fault] += 1
                open_at[key] = e["t"]
            elif e["type"] == ends and key in open_at:
                total += e["t"] - open_at.pop(key)
        total += sum(end - t for t in open_at.values())  # not ended by the end of the history
        seconds[fault] = round(total, 3)
    return counts, seconds
