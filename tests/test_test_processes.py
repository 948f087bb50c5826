"""The suite's own parallel run: a test marked ``alone`` runs while no other test process runs a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).with_name("alone_probe.py")


def _intervals(log: Path) -> dict[str, tuple[int, float, float]]:
    starts, spans = {}, {}
    for event, name, pid, at in map(json.loads, log.read_text().splitlines()):
        if event == "start":
            starts[name] = (pid, at)
        else:
            spans[name] = (starts[name][0], starts[name][1], at)
    return spans


def test_an_alone_test_overlaps_no_other_while_the_others_overlap(tmp_path):
    log = tmp_path / "probe.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "load", "-p", "no:cacheprovider", "-q", str(PROBE)],
        env={**os.environ, "ESDLOCK_PROBE_LOG": str(log)},
        cwd=PROBE.parent.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    spans = _intervals(log)
    assert len(spans) == 13, spans
    _, alone_start, alone_end = spans.pop("alone")
    beside = [name for name, (_, start, end) in spans.items() if start < alone_end and alone_start < end]
    assert not beside, f"{beside} ran beside the alone test"
    assert len({pid for pid, _, _ in spans.values()}) == 2, f"one process ran every test: {spans}"
    overlapping = [
        (a, b) for a, (_, s1, e1) in spans.items() for b, (_, s2, e2) in spans.items() if a < b and s1 < e2 and s2 < e1
    ]
    assert overlapping, f"no two tests ran at once: the run proves nothing of the alone test ({spans})"
