"""The admin never discards an intent silently; its recoveries and reaps run as tasks where it can, all logged."""

from __future__ import annotations

import io
import json
import signal

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.core.management import call_command
from django.test import override_settings

from django_esdlock.modes import Mode

from . import (
    admin_support,
    handlers,  # noqa: F401  (registers the test recovery handlers)
)
from .contract import all_holders, raw_grant
from .expiry import expire
from .locked_tasks import IMMEDIATE_BACKEND

LIST = "/admin/django_esdlock/heldlock/"
RELEASE = LIST + "release/"
REAP = LIST + "reap/"
INLINE = {"default": {"BACKEND": IMMEDIATE_BACKEND}}
"""A task backend that runs tasks in the request: the admin runs the work inline and says so."""

pytestmark = pytest.mark.django_db

lock_config = admin_support.lock_config  # the shared fixtures, by name in this module
releaser = admin_support.releaser


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def runs(out) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def holding_with_intent(peer, out) -> dict:
    return peer.acquire("job", scheme="tree", path="/job", intent={"op": "test-append", "file": str(out)}, ttl=30)


def confirm(releaser, holder: str, **choices: str):
    """Show the confirmation page, then post its form as a user would: its hidden fields, the choices given."""
    page = releaser.post(RELEASE, {"holder": holder})
    assert page.status_code == 200
    (shown,) = page.context["holders"]
    data = {"holder": holder, "confirm": "yes", f"seen-{holder}": shown["seen"], **choices}
    return page, releaser.post(RELEASE, data, follow=True)


def test_the_confirmation_page_says_the_intent_is_discarded_and_offers_recover_now(
    releaser, lock_config, peer, backend, tmp_path
):
    held = holding_with_intent(peer, tmp_path / "runs.jsonl")
    page = releaser.post(RELEASE, {"holder": held["holder_id"]})
    html = page.content.decode()
    assert "carries an intent" in html and "discards the intent" in html and "test-append" in html
    holder = held["holder_id"]
    assert f'name="intent-{holder}" value="recover" checked' in html  # the default
    assert f'name="intent-{holder}" value="discard">' in html  # offered, never pre-selected
    assert "runs as a task" in html  # the tests' settings configure a database task backend
    assert len(all_holders(backend)) == 1  # nothing released before confirmation


@override_settings(TASKS=INLINE)
def test_recover_now_runs_the_handler_then_releases_and_logs_it(releaser, lock_config, peer, backend, tmp_path):
    out = tmp_path / "runs.jsonl"
    held = holding_with_intent(peer, out)
    page, done = confirm(releaser, held["holder_id"], **{f"intent-{held['holder_id']}": "recover"})
    assert "runs in this request" in page.content.decode()
    assert [r["token"] > held["token"] for r in runs(out)] == [True]  # once, under a newer token
    assert all_holders(backend) == []
    (message,) = messages_of(done)
    assert message.startswith(f"Recovered holder {held['holder_id']} (inline: no task backend is configured)")
    (entry,) = LogEntry.objects.filter(object_id=held["holder_id"])
    assert entry.action_flag == CHANGE and entry.user.username == "releaser"
    assert "ran the handler of 'test-append'" in entry.change_message


def test_an_intent_is_discarded_only_when_chosen(releaser, lock_config, peer, backend, tmp_path):
    out = tmp_path / "runs.jsonl"
    held = holder = holding_with_intent(peer, out)["holder_id"]
    # A confirmation without a choice (an old form, a hand-made POST): nothing happens.
    refused = releaser.post(RELEASE, {"holder": holder, "confirm": "yes"}, follow=True)
    assert "carries an intent: choose to recover it or to discard it" in messages_of(refused)[0]
    assert len(all_holders(backend)) == 1 and not LogEntry.objects.exists()
    _, done = confirm(releaser, held, **{f"intent-{holder}": "discard"})
    assert all_holders(backend) == [] and runs(out) == []  # released, the handler never ran
    assert any("Discarded the intent" in m for m in messages_of(done))
    (entry,) = LogEntry.objects.filter(object_id=holder)
    assert entry.action_flag == DELETION and entry.user.username == "releaser"
    assert "Discarded its intent" in entry.change_message and "test-append" in entry.change_message


def test_a_holder_that_changed_hands_after_the_confirmation_page_is_left_held(releaser, lock_config, backend):
    grant = raw_grant(backend, "/job", Mode.X, ttl=30)
    holder = grant.request.holder_id
    page = releaser.post(RELEASE, {"holder": holder})
    (shown,) = page.context["holders"]
    # Claimed meanwhile (a hand-off's worker, a reaper): another owner now.
    records = backend.holder_records(holder)
    from django_esdlock.records import Owner

    taken = backend.take_over(records, Owner.current(), ttl=30, recovery=None, require_expired=False)
    assert taken is not None
    done = releaser.post(RELEASE, {"holder": holder, "confirm": "yes", f"seen-{holder}": "someone-else"}, follow=True)
    assert any("changed hands since you confirmed" in m for m in messages_of(done))
    assert len(all_holders(backend)) == 1 and not LogEntry.objects.exists()
    assert shown["seen"] == grant.request.owner.key
    backend.release(taken)


@pytest.mark.django_db(transaction=True)  # the worker reads the committed task rows
def test_recover_now_and_reap_now_run_as_tasks_on_a_worker(releaser, lock_config, peer, backend, tmp_path):
    out = tmp_path / "runs.jsonl"
    held = holding_with_intent(peer, out)
    _, done = confirm(releaser, held["holder_id"], **{f"intent-{held['holder_id']}": "recover"})
    (message,) = messages_of(done)
    assert message.startswith(f"Recovery of holder {held['holder_id']} enqueued as task")
    assert runs(out) == [] and len(all_holders(backend)) == 1  # not in the request
    expire(backend, raw_grant(backend, "/stale", Mode.X, ttl=30).request.holder_id)
    reaped = releaser.post(REAP, follow=True)
    assert messages_of(reaped)[0].startswith("Reaping enqueued as task")
    # db_worker installs its own SIGINT/SIGTERM/SIGQUIT handlers and leaves them: without the restore, a
    # SIGTERM to this test run (a CI timeout) would raise SystemExit(0) in whatever test runs then.
    installed = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)}
    try:
        call_command(
            "db_worker", "--batch", "--no-reload", "--no-startup-delay", stdout=io.StringIO(), stderr=io.StringIO()
        )
    finally:
        for sig, handler in installed.items():
            signal.signal(sig, handler)
    assert len(runs(out)) == 1 and all_holders(backend) == []
    holder = held["holder_id"]

    def entry(start: str) -> LogEntry:
        (found,) = [e for e in LogEntry.objects.all() if e.change_message.startswith(start)]
        assert found.user.username == "releaser" and found.action_flag == CHANGE
        return found

    entry(f"Recovery of holder {holder} enqueued as task")  # in the request
    entry("Reaping enqueued as task")
    assert "ran the handler of 'test-append'" in entry(f"Recovered holder {holder} (as a task)").change_message
    assert "removed 1 expired holder(s)" in entry("Reaped (as a task)").change_message  # by the worker


@override_settings(TASKS=INLINE)
def test_reap_now_inline_says_so_and_logs_it(releaser, lock_config, backend, tmp_path):
    expire(backend, raw_grant(backend, "/stale", Mode.X, ttl=30).request.holder_id)
    response = releaser.post(REAP, follow=True)
    assert all_holders(backend) == []
    assert messages_of(response) == ["Ran in this request (no task backend is configured). Removed 1 expired holder."]
    (entry,) = LogEntry.objects.all()
    assert entry.user.username == "releaser" and entry.object_repr == "reap_locks"
    assert entry.change_message.startswith("Reaped (inline: no task backend is configured): removed 1 expired")
