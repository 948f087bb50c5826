"""Forced releases free only the holder that was listed, and --local-pids only the dead of this pid namespace."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import io
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_esdlock import LockUnavailable, lock_tree, resume_lock
from django_esdlock.handoff import Ticket
from django_esdlock.modes import Mode
from django_esdlock.reaper import Reaper, release_if_unchanged
from django_esdlock.records import Kind, LockRequest, Node, Owner, pid_namespace

from .contract import all_holders

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def lock_config(store_config):
    return store_config


def reap(config, *args: str) -> dict:
    out = io.StringIO()
    with override_settings(LOCK_BACKEND=config):
        call_command("reap_locks", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def dead_local_owner() -> Owner:
    """An owner of this host and pid namespace whose process is gone."""
    return dataclasses.replace(Owner.current(), pid=dead_pid(), process=uuid.uuid4().hex, started=None)


def grant_of(backend, owner: Owner, path: str, *, ttl: float = 60):
    node = Node("default", Kind.TREE, path)
    grant = backend.acquire(LockRequest(f"h-{uuid.uuid4().hex}", owner, ((node, Mode.X),), ttl))
    assert grant is not None
    return grant


def owners_of(backend, path: str) -> list[str]:
    return [r.owner.get("key") for r in backend.node_holders(Node("default", Kind.TREE, path))]


# --- conditional on the holder still being the one listed -----------------------


def test_a_renewal_between_listing_and_release_keeps_the_lock(backend):
    grant = grant_of(backend, Owner.current(), "/renewed")
    listed = backend.holder_records(grant.request.holder_id)
    # The holder lives: it renews, and its lease moves on (a longer one: the store's clock may not have ticked).
    longer = dataclasses.replace(grant, request=dataclasses.replace(grant.request, ttl=grant.request.ttl + 30))
    assert backend.renew(longer)
    assert release_if_unchanged(backend, listed) is False
    assert owners_of(backend, "/renewed") == [grant.request.owner.key]
    relisted = backend.holder_records(grant.request.holder_id)
    assert release_if_unchanged(backend, relisted) is True
    assert all_holders(backend) == []


def test_a_handoff_claimed_between_listing_and_release_keeps_the_lock(backend):
    lock = lock_tree("/handed", ttl=30, backend=backend).acquire()
    holder_id = lock.holder_id
    ticket = lock.handoff(ttl=30)
    listed = backend.holder_records(holder_id)
    with concurrent.futures.ThreadPoolExecutor(1) as worker:  # another thread: another owner, as a task worker is
        claimed = worker.submit(resume_lock(ticket, backend=backend).acquire).result(timeout=30)
        claimant = worker.submit(lambda: Owner.current().key).result(timeout=30)
        try:
            assert release_if_unchanged(backend, listed) is False
            assert owners_of(backend, "/handed") == [claimant] != [lock_owner(listed)]
            claimed.check()
        finally:
            worker.submit(claimed.release).result(timeout=30)


def lock_owner(records) -> str:
    return records[0].owner["key"]


def test_reap_local_pids_leaves_a_handoff_claimed_while_it_reaped(lock_config, backend, monkeypatch):
    """The handing process is gone (a web request's worker exited); the ticket is claimed as the reaper works."""
    grant = grant_of(backend, dead_local_owner(), "/job", ttl=30)
    ticket = Ticket.of(grant, ttl=30, checkpoint=None).encode()
    claimed = []
    listing = Reaper._all_holders

    def listing_then_claim(self):
        listed = list(listing(self))
        claimed.append(resume_lock(ticket, backend=backend).acquire())
        return iter(listed)

    monkeypatch.setattr(Reaper, "_all_holders", listing_then_claim)
    report = reap(lock_config, "--local-pids")
    assert report["counts"]["dead_local"] == 0 and [h["path"] for h in report["changed"]] == ["/job"]
    (lock,) = claimed
    assert owners_of(backend, "/job") == [Owner.current().key]
    other = dataclasses.replace(Owner.current(), process=uuid.uuid4().hex)
    refused = LockRequest("other", other, ((Node("default", Kind.TREE, "/job"), Mode.X),), 30)
    assert backend.acquire(refused) is None  # still held by the claimant
    lock.release()


def test_reap_local_pids_frees_the_dead_holder_that_nobody_claimed(lock_config, backend):
    grant_of(backend, dead_local_owner(), "/job", ttl=60)
    report = reap(lock_config, "--local-pids")
    assert report["counts"]["dead_local"] == 1 and report["counts"]["changed"] == 0
    assert all_holders(backend) == []


# --- pid namespaces ------------------------------------------------------------------


def test_owners_record_their_pid_namespace():
    owner = Owner.current().as_dict()
    assert owner["pidns"] == pid_namespace() is not None
    stat = os.stat("/proc/self/ns/pid")
    assert owner["pidns"].endswith(f"/{stat.st_ino}")


def test_an_owner_of_another_pid_namespace_is_never_declared_dead():
    from django_esdlock.reaper import process_is_gone

    gone = {**Owner.current().as_dict(), "pid": dead_pid()}
    assert process_is_gone(gone) is True
    assert process_is_gone({**gone, "pidns": "another-boot/4026532000"}) is False
    assert process_is_gone({**gone, "pidns": None}) is False  # recorded by an older release: unprovable


@contextlib.contextmanager
def holder_in_own_pid_namespace(config: dict, ttl: float) -> Iterator[tuple[subprocess.Popen, dict]]:
    """Run tests/pidns_holder.py in a new pid namespace (as pid 1 there, like a container's main process)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1)")
    command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-m", "tests.pidns_holder"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [*command, json.dumps(config), str(ttl)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process, read_line(process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def read_line(process: subprocess.Popen, timeout: float = 60) -> dict:
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    if not ready:
        process.kill()
        pytest.fail(f"the holder printed nothing within {timeout:g}s: {process.stderr.read()}")
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=30)
        pytest.fail(f"the holder exited with {process.returncode}: {process.stderr.read()}")
    return json.loads(line)


def test_reap_local_pids_leaves_a_live_holder_of_another_pid_namespace(lock_config, backend):
    if os.geteuid() != 0:
        pytest.skip("unshare --pid needs root")
    with holder_in_own_pid_namespace(lock_config, ttl=60) as (process, held):
        owner = held["owner"]
        assert owner["host"] == socket.gethostname() and held["pid"] == 1  # its pid means another process here
        assert owner["pidns"] != pid_namespace()
        report = reap(lock_config, "--local-pids")
        assert report["counts"]["dead_local"] == 0
        assert {r.node.key for r in all_holders(backend)} == {"/container", "/container/job"}
        with pytest.raises(LockUnavailable):
            lock_tree("/container/job", namespace="pidns", timeout=0, backend=backend).acquire()
        process.stdin.close()  # let it release
        assert read_line(process) == {"lost": False}
    assert all_holders(backend) == []


def test_a_dead_holder_of_another_pid_namespace_waits_for_its_lease(lock_config, backend):
    """Killed in its container: this host cannot tell its pid from ours, so only the lease frees it."""
    if os.geteuid() != 0:
        pytest.skip("unshare --pid needs root")
    with holder_in_own_pid_namespace(lock_config, ttl=2) as (process, _held):
        process.kill()
        process.wait(timeout=30)
        assert reap(lock_config, "--local-pids")["counts"]["dead_local"] == 0
        assert {r.node.key for r in all_holders(backend)} == {"/container", "/container/job"}
    with lock_tree("/container/job", namespace="pidns", timeout=10, backend=backend):
        pass  # the lease ran out: the next acquisition evicted it
