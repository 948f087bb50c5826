"""A rename as a background task in a real browser: its worker is killed mid-rename, reap_locks finishes it.

The page's "Rename (task)" locks in the view and hands the locks to a
``db_worker`` process; the task page follows the task and shows the locks
its worker holds. The worker is SIGKILLed half-way; once the lease runs out
the page says the rename awaits recovery, and ``reap_locks`` rolls it forward.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from example_project.fs.tasks import worker_command

from .browser import chromium_page, screenshot
from .example_support import example_fs, worker_env

DIRECTORY = "/clinton/projects"
TTL = 2.0


@pytest.fixture
def fs(es_url):
    with example_fs(es_url, ttl=TTL) as fs:
        fs.seed(300)
        yield fs


@pytest.fixture
def worker(fs, tmp_path):
    """A db_worker on the test's stores, slowed down to a batch of 5 documents every 0.3 s."""
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below
    env = {**os.environ, **worker_env(fs, FS_TASK_PAUSE="0.3", FS_TASK_BATCH_SIZE="5")}
    process = subprocess.Popen(worker_command(interval=0.1), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        log.close()


@pytest.mark.django_db(transaction=True)
def test_a_task_rename_whose_worker_is_killed_is_finished_by_reap_locks(fs, worker, live_server, tmp_path):
    files = fs.index.count(DIRECTORY)
    assert files > 15  # enough batches to kill the worker half-way
    with chromium_page() as page:
        page.goto(f"{live_server.url}/browse/clinton")
        row = page.locator(f'tr[data-path="{DIRECTORY}"]')
        row.locator("input[name=to]").fill("work")
        row.get_by_role("button", name="Rename (task)").click()
        expect(page).to_have_url(re.compile(r"/tasks/"))
        # The worker claimed the locks: the panel shows its process as the owner, and its progress.
        lock = page.locator(f'.lock[data-path="{DIRECTORY}"]')
        expect(lock).to_contain_text(f"pid {worker.pid}", timeout=30_000)
        expect(page.locator("#task-status")).to_have_attribute("data-status", "RUNNING")
        expect(lock).to_contain_text(re.compile(r"checkpoint: [1-9][0-9]* moved"), timeout=30_000)
        screenshot(page, "example-task-running")
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        fs.index.refresh()
        moved = fs.index.count("/clinton/work")
        # Its lease runs out; the intent keeps both paths locked, awaiting the reaper.
        expect(lock).to_contain_text("awaiting recovery by reap_locks", timeout=(TTL + 10) * 1000)
        screenshot(page, "example-task-killed")
        report = io.StringIO()
        call_command("reap_locks", "--json", stdout=report)
        assert json.loads(report.getvalue())["counts"]["recovered"] == 2  # the source's lock and the destination's
        # A page of its own: the task page reloads itself every second, and a reload due may win over a goto.
        page = page.context.browser.new_page(viewport=page.viewport_size)
        page.goto(f"{live_server.url}/browse/clinton")
        expect(page.locator('tr[data-path="/clinton/work"]')).to_be_visible()
        expect(page.locator(f'tr[data-path="{DIRECTORY}"]')).to_have_count(0)
        expect(page.locator("#locks + p + p")).to_have_text("No lock is held here.")
        screenshot(page, "example-task-recovered")
    assert 0 < moved < files  # killed half-way, then finished by the reaper
    assert fs.index.count(DIRECTORY) == 0 and fs.index.count("/clinton/work") == files
    assert fs.duplicated_paths() == []
