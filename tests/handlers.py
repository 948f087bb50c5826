"""Recovery handlers for the tests, importable by spawned reaper processes."""

from __future__ import annotations

import json
import time

from django_esdlock.recovery import recovery_handler


@recovery_handler("test-append")
def append_line(*, intent, checkpoint, lock):
    """Append one JSON line per run to the file the intent names: how many times did it run?"""
    time.sleep(intent.get("sleep", 0))
    lock.check()
    with open(intent["file"], "a") as f:
        f.write(json.dumps({"token": lock.token, "checkpoint": checkpoint}) + "\n")


@recovery_handler("test-fail-once")
def fail_unless_marker(*, intent, checkpoint, lock):
    """Fail while the intent's marker file is missing; succeed (and append) once it exists."""
    import os

    if not os.path.exists(intent["marker"]):
        raise RuntimeError("the marker file is missing")
    with open(intent["file"], "a") as f:
        f.write(json.dumps({"token": lock.token}) + "\n")
