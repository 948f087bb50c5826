"""Run by ``test_test_processes.py`` in a pytest of two test processes (not collected by the suite itself).

Each test writes when it starts and ends to ``ESDLOCK_PROBE_LOG``: the
caller checks that the ``alone`` test overlapped no other, and that the
others did overlap one another (so the run had two processes at work).
"""

from __future__ import annotations

import json
import os
import time

import pytest

BODY = 0.3
"""How long each test's body lasts: long enough for the other process to start a test beside it."""


def _record(event: str, name: str) -> None:
    with open(os.environ["ESDLOCK_PROBE_LOG"], "a") as log:  # one short append per line: whole lines
        log.write(json.dumps([event, name, os.getpid(), time.monotonic()]) + "\n")


def _body(name: str) -> None:
    _record("start", name)
    time.sleep(BODY)
    _record("end", name)


@pytest.mark.alone
def test_alone():
    _body("alone")


@pytest.mark.parametrize("i", range(12))
def test_shared(i):
    _body(f"shared-{i}")
