"""lock_check's guarded data: each exclusive grant appends to a record of the store's data, judged at the end.

Fenced (the fencing helpers and a compare-and-set), a run under pauses and
kills keeps every acknowledged append and refuses the late ones of holders
that lost their lock; plain (the control), the late appends overwrite what
newer holders wrote, and the checker must say so.
"""

from __future__ import annotations

import pytest

from django_esdlock.checker.checker import check_guarded

from .test_lock_check import run_seed

pytest_plugins = ["django_esdlock.testing"]

RUN = {"seconds": 8.0, "processes": 4, "ttl": 1.0, "faults": ("pause", "kill", "store")}
"""Pauses past the lease make the late appends the fence must refuse; kills leave appends in flight; store cuts
(not on SQLite, which has no connection to cut) cut the locks' connections, not the data's: holders lose locks
while their data stays writable, which only the fence then guards."""


@pytest.mark.slow  # multi-process, like lock_check's other runs: ./runtests runs it on every store
def test_fenced_appends_survive_pauses_and_kills_on_every_store(lock_check, store_config):
    seed = run_seed()
    late = 0
    for attempt in range(3):  # every pause may hit a holder without an exclusive node: then run again
        result = lock_check({**store_config, "DEADLOCK_TIMEOUT": 0.3}, seed=seed + attempt, guarded="fenced", **RUN)
        print(result.report())
        assert result.ok, f"seed {seed + attempt}\n{result.report()}"
        counts = result.summary["guarded"]
        errors = [e.get("error") for e in result.events if e["type"] == "append" and e["outcome"] == "error"]
        assert counts.get("ok", 0) > 10, f"{counts}; errors: {errors[:3]}"
        assert any(e["type"] == "data" for e in result.events)
        late = sum(n for k, n in counts.items() if k.startswith("late_"))
        if late:
            break
    assert late >= 1, f"seed {seed}: no holder came back from a pause to append late in 3 runs: {counts}"


@pytest.mark.slow
def test_the_checker_catches_plain_appends_that_a_late_holder_overwrites(lock_check, store_config):
    """The control run: the same workload through plain updates. A holder paused past its lease comes back and
    writes the list it read before the pause: the appends of the holders granted meanwhile are gone."""
    seed = run_seed()
    config = {**store_config, "DEADLOCK_TIMEOUT": 0.3}
    caught = []
    for attempt in range(3):  # a pause may meet no other append to its record: then run again
        # Pauses alone: one every few seconds, each a holder that comes back to write late.
        result = lock_check(
            config, seed=seed + attempt, guarded="plain", **{**RUN, "seconds": 10.0, "faults": ("pause",)}
        )
        caught = [v for v in result.violations if v.check == "f"]
        if caught:
            break
    print(result.report())
    assert caught, f"seed {seed}: plain appends lost nothing in 3 runs\n{result.report()}"
    # The late holder's write takes the appends of those granted meanwhile away, or lands after a newer token's.
    assert all("acknowledged append" in v.message or "appended after" in v.message for v in caught), caught


def _append(item, key, token, outcome, t):
    return {"t": t, "type": "append", "op": item, "item": item, "key": key, "token": token, "outcome": outcome}


def test_the_guarded_data_check_on_crafted_histories():
    final = {"t": 10.0, "type": "data", "key": "tree:/a", "ops": ["w0-0", "w1-0"]}
    good = [_append("w0-0", "tree:/a", 1, "ok", 1.0), _append("w1-0", "tree:/a", 2, "ok", 2.0)]
    assert check_guarded([*good, _append("w0-0-late", "tree:/a", 1, "stale", 3.0), final]) == []
    # An acknowledged append missing: a lost update.
    (lost,) = check_guarded([*good, _append("w2-0", "tree:/a", 3, "ok", 3.0), final])
    assert lost.check == "f" and "w2-0" in lost.message and "lost" in lost.message
    # A refused append present.
    refused = {**final, "ops": ["w0-0", "w1-0", "w0-0-late"]}
    kept = check_guarded([*good, _append("w0-0-late", "tree:/a", 1, "stale", 3.0), refused])
    assert any("refused" in v.message for v in kept) and any("appended after" in v.message for v in kept)
    # An older token's append after a newer one's.
    backwards = {**final, "ops": ["w1-0", "w0-0"]}
    (order,) = check_guarded([*good, backwards])
    assert "appended after" in order.message
    # An append that failed (indeterminate) may or may not have landed.
    assert check_guarded([*good, _append("w2-0", "tree:/a", 3, "error", 3.0), final]) == []
