"""Recovery runs a holder's handler once in effect: marked recovering, then done; one failure never stops a pass."""

from __future__ import annotations

import json
import uuid

import pytest

from django_esdlock.conf import load_backend
from django_esdlock.exceptions import LockBackendUnavailable
from django_esdlock.modes import Mode
from django_esdlock.reaper import DONE, Reaper
from django_esdlock.records import Kind, LockRequest, Node, Owner

from . import handlers  # noqa: F401  (registers the test recovery handlers)
from .contract import all_holders
from .leases import backdate

LEASE = 1.0


@pytest.fixture
def backend(store_config):
    """A store whose takeovers (and so a reaper's lease on what it recovers) last one second."""
    backend = load_backend({**store_config, "TTL": LEASE})
    yield backend
    backend.close()


def dead_holder_with_intent(backend, path: str, out) -> str:
    """A holder whose lease has run out, carrying an intent whose handler appends a line to ``out``."""
    intent = {"op": "test-append", "file": str(out)}
    request = LockRequest(
        f"dead-{uuid.uuid4().hex}", Owner.current(), ((Node("default", Kind.TREE, path), Mode.X),), 30, intent=intent
    )
    assert backend.acquire(request) is not None
    return request.holder_id


def runs(out) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def expire(config, holder_ids) -> None:
    """Make these holders' leases run out, by the store's own clock (back-dated: no wait, no clock lag)."""
    for holder_id in holder_ids:
        backdate(config, holder_id)


def test_a_release_that_fails_after_the_handler_does_not_run_it_again(backend, store_config, monkeypatch, tmp_path):
    first_out, second_out = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first = dead_holder_with_intent(backend, "/a-job", first_out)  # reaped first: node order
    second = dead_holder_with_intent(backend, "/b-job", second_out)
    expire(store_config, [first, second])

    release = backend.release
    failed = []

    def release_failing_once(grant):
        if grant.request.holder_id == first and not failed:
            failed.append(grant.token)
            raise LockBackendUnavailable("the store went away just after the handler finished")
        return release(grant)

    monkeypatch.setattr(backend, "release", release_failing_once)
    report = Reaper(backend).run()
    assert failed, "the release of the first holder was never tried"
    assert [f["holder"]["holder_id"] for f in report.failed] == [first]
    assert "went away" in report.failed[0]["error"]
    assert [r["holder"]["holder_id"] for r in report.recovered] == [second]  # the pass went on
    assert len(runs(first_out)) == len(runs(second_out)) == 1
    (left,) = [r for r in all_holders(backend) if r.holder_id == first]
    assert left.recovery["state"] == DONE and left.recovery["attempts"] == 1

    expire(store_config, [first])  # the reaper's own lease on it runs out
    report = Reaper(backend).run()
    assert [r["holder"]["holder_id"] for r in report.finished] == [first]
    assert report.recovered == [] and report.failed == []
    assert len(runs(first_out)) == 1  # the handler ran once over the two passes
    assert all_holders(backend) == []


def test_a_failing_handler_is_one_holders_failure(backend, store_config, tmp_path):
    """A handler that raises marks its holder failed; the holders after it in the same pass are recovered."""
    marker = tmp_path / "marker"
    intent = {"op": "test-fail-once", "marker": str(marker), "file": str(tmp_path / "never.jsonl")}
    failing = LockRequest("failing", Owner.current(), ((Node("default", Kind.TREE, "/a-job"), Mode.X),), 30, intent)
    assert backend.acquire(failing) is not None
    out = tmp_path / "ok.jsonl"
    ok = dead_holder_with_intent(backend, "/b-job", out)
    expire(store_config, ["failing", ok])
    report = Reaper(backend).run()
    assert [f["holder"]["holder_id"] for f in report.failed] == ["failing"]
    assert [r["holder"]["holder_id"] for r in report.recovered] == [ok] and len(runs(out)) == 1
    (left,) = all_holders(backend)
    assert left.holder_id == "failing" and left.recovery["state"] == "failed"
