"""A directory rename killed half-way is finished by reap_locks: everything moved, once, under a newer token."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from django_esdlock import LockUnavailable, get_backend, lock_tree
from django_esdlock.records import Kind, Node
from example_project.fs.renames import StaleToken, move_tree

from .example_support import example_fs
from .expiry import expire
from .peer import Peer

ROOT_DIR = Path(__file__).resolve().parent.parent
TTL = 30.0


@pytest.fixture
def fs(es_url):
    with example_fs(es_url, ttl=TTL) as fs:
        yield fs


def start_renamer(fs, src: str, dst: str, *args: str) -> subprocess.Popen:
    """Run ``manage.py fs_rename`` in its own process, on the test's stores, printing progress lines."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "ELASTICSEARCH_URL": fs.es_url,
        "FS_INDEX": fs.index.name,
        "LOCK_URL": fs.lock_url,
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "manage.py", "fs_rename", src, dst, *args]
    return subprocess.Popen(command, cwd=ROOT_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_progress(process: subprocess.Popen, at_least: int) -> int:
    """Read the renamer's progress lines until it reports ``at_least`` documents moved; return that count."""
    for line in process.stdout:
        match = re.search(r"([\d,]+)/[\d,]+ documents", line)
        if match and int(match.group(1).replace(",", "")) >= at_least:
            return int(match.group(1).replace(",", ""))
    raise AssertionError(f"the renamer exited with {process.wait()} before moving {at_least} documents")


def reap() -> dict:
    out = io.StringIO()
    call_command("reap_locks", "--json", stdout=out)
    return json.loads(out.getvalue())


def locked(path: str) -> bool:
    try:
        lock_tree(path, namespace="fs", timeout=0).acquire().release()
    except LockUnavailable:
        return True
    return False


def test_killed_directory_rename_is_finished_by_reap_locks(fs):
    fs.seed(1500)
    before = fs.snapshot()
    clinton = {i for i, (path, _) in before.items() if path == "/clinton" or path.startswith("/clinton/")}
    assert len(clinton) > 1000

    renamer = start_renamer(fs, "/clinton", "/bill-new", "--batch-size", "50", "--pause", "0.1")
    try:
        moved = wait_for_progress(renamer, at_least=200)
        renamer.send_signal(signal.SIGKILL)
    finally:
        renamer.kill()
        renamer.wait()
    assert renamer.returncode == -signal.SIGKILL

    # Half done: some documents moved, the rest not, none in both places.
    half = fs.snapshot()
    assert moved <= fs.index.count("/bill-new") < len(clinton)
    assert fs.index.count("/clinton") + fs.index.count("/bill-new") == len(clinton)
    (dead,) = [h for h in get_backend().node_holders(Node("fs", Kind.TREE, "/clinton")) if h.mode.value == "X"]
    assert dead.intent["op"] == "rename" and dead.checkpoint["moved"] >= moved
    dead_token = max(token for doc_id, (path, token) in half.items() if path.startswith("/bill-new"))

    # Its lease runs out, but the intent keeps both subtrees blocked until recovered.
    expire(get_backend())
    assert locked("/clinton/projects") and locked("/bill-new")

    report = reap()
    assert report["counts"]["recovered"] == 2 and report["counts"]["failed"] == 0, report

    after = fs.snapshot()
    assert set(after) == set(before)  # no document lost, none created
    assert fs.duplicated_paths() == []
    assert fs.index.count("/clinton") == 0
    assert fs.index.count("/bill-new") == len(clinton)
    for doc_id in clinton:
        assert after[doc_id][0] == "/bill-new" + before[doc_id][0][len("/clinton") :]
    assert {doc_id: after[doc_id] for doc_id in after if doc_id not in clinton} == {
        doc_id: before[doc_id] for doc_id in before if doc_id not in clinton
    }
    # Every document of the rename now carries the recovery's newer token: the dead renamer,
    # should it wake up, has every write refused, also on what it had moved itself.
    assert all(after[doc_id][1] > dead_token for doc_id in clinton)
    with pytest.raises(StaleToken):
        move_tree(fs.index, "/bill-new", "/clinton", token=dead_token)
    assert fs.snapshot() == after
    assert not locked("/clinton") and not locked("/bill-new")


def test_rename_killed_before_moving_anything_is_released_unchanged(fs):
    fs.seed(100)
    before = fs.snapshot()
    victim = Peer(fs.lock_config)
    try:
        # What fs_rename holds between taking its locks and its first checkpoint.
        intent = {"op": "rename", "rename": "r1", "index": fs.index.name, "src": "/bill", "dst": "/william"}
        for role, path in (("dst", "/william"), ("src", "/bill")):
            spec = {"scheme": "tree", "path": path, "namespace": "fs", "ttl": TTL, "intent": {**intent, "role": role}}
            assert "token" in victim.acquire(role, **spec)
        victim.kill()
        expire(get_backend())  # its leases run out
        assert locked("/bill") and locked("/william")
        assert reap()["counts"]["recovered"] == 2
    finally:
        victim.close()
    assert fs.snapshot() == before
    assert not locked("/bill") and not locked("/william")
