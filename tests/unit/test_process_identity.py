"""Telling a dead or replaced local process from a live one, for reap_locks --local-pids."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from django_esdlock.reaper import process_is_gone
from django_esdlock.records import Owner, pid_namespace, process_start


def test_a_live_owner_is_not_gone():
    owner = Owner.current().as_dict()
    assert owner["started"] == process_start(os.getpid()) is not None
    assert process_is_gone(owner) is False


def test_a_dead_pid_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    here = {"host": socket.gethostname(), "pidns": pid_namespace()}
    assert process_is_gone({**here, "pid": child.pid, "started": None}) is True


def test_a_reused_pid_is_gone():
    # Our pid is alive, but not the process that took the lock: its start identity differs.
    owner = {**Owner.current().as_dict(), "started": "another-boot/12345"}
    assert process_is_gone(owner) is True


def test_other_hosts_and_unknown_starts_are_never_declared_dead():
    assert process_is_gone({**Owner.current().as_dict(), "host": "elsewhere"}) is False
    here = {"host": socket.gethostname(), "pidns": pid_namespace()}
    assert process_is_gone({**here, "pid": os.getpid(), "started": None}) is False
    assert process_is_gone({"host": socket.gethostname(), "pid": "x"}) is False
