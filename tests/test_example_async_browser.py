"""The example served by uvicorn (ASGI) in a real browser: the async rename view refused, then waiting, then done."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from django_esdlock.conf import load_backend
from example_project.fs.tree import README

from .browser import chromium_page, screenshot
from .example_support import ExampleFs, example_fs
from .peer import Peer
from .waiting_state import wait_for_waiters

ROOT_DIR = Path(__file__).resolve().parent.parent
DIRECTORY = "/clinton/projects/elasticsearch"
START_TIMEOUT = 30.0
LOCK_WAIT = 10
"""Seconds a rename from the page may wait (the "wait" box): far longer than the test's release takes."""


@pytest.fixture
def fs(es_url):
    with example_fs(es_url) as fs:
        fs.seed(300)
        yield fs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def uvicorn_server(fs: ExampleFs, log: Path) -> Iterator[str]:
    """Serve the example project with uvicorn on a free port, on the test's stores; yield its URL; stop it after."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "ELASTICSEARCH_URL": fs.es_url,
        "FS_INDEX": fs.index.name,
        "LOCK_URL": fs.lock_url,
        "FS_LOCK_WAIT": str(LOCK_WAIT),
        "DEBUG": "false",
    }
    command = [sys.executable, "-m", "uvicorn", "example_project.asgi:application", "--port", str(port)]
    command += ["--host", "127.0.0.1", "--no-access-log"]
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=ROOT_DIR, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if server.poll() is not None:
                raise AssertionError(f"uvicorn exited with {server.returncode}:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(url + "/", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"uvicorn did not answer within {START_TIMEOUT:g}s:\n{log.read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def submit_async_rename(page, path: str, to: str, *, wait: bool = False) -> None:
    row = page.locator(f'tr[data-path="{path}"]')
    row.locator("input[name=to]").fill(to)
    row.locator("input[name=wait]").set_checked(wait)
    row.get_by_role("button", name="Rename (async)").click()


def test_the_async_view_under_uvicorn_refuses_then_waits_for_a_lock_in_the_browser(fs, tmp_path):
    peer = Peer(fs.lock_config)
    try:
        assert "token" in peer.acquire("readme", scheme="tree", path=README, namespace="fs")
        pid = peer.pid()
        with uvicorn_server(fs, tmp_path / "uvicorn.log") as url, chromium_page() as page:
            response = page.goto(f"{url}/browse/clinton/projects")
            assert response is not None and response.headers.get("server") == "uvicorn"
            expect(page.locator(f'.lock[data-path="{README}"]')).to_contain_text(f"pid {pid}")

            submit_async_rename(page, DIRECTORY, "es")
            conflict = page.locator(".messages li.conflict")
            expect(conflict).to_contain_text(f"Conflict: {DIRECTORY} cannot be renamed now")
            expect(conflict).to_contain_text(f"exclusive lock on {README} held by pid {pid}")
            expect(page.locator(f'tr[data-path="{DIRECTORY}"]')).to_be_visible()  # nothing changed

            # Ticked "wait": the request's task waits on the server's event loop until the peer lets go.
            # Released from another thread once the store shows the request waiting (the click returns only
            # once the page has its answer): it waited for the peer, it did not come after it.
            events: list[str] = []

            def release_once_waiting() -> None:
                watcher = load_backend(fs.lock_config)
                try:
                    wait_for_waiters(watcher, 1, what="the async rename waiting", timeout=LOCK_WAIT)
                    events.append("waiting")
                    peer.release("readme")
                    events.append("released")
                finally:
                    watcher.close()

            release = threading.Thread(target=release_once_waiting)
            release.start()
            try:
                submit_async_rename(page, DIRECTORY, "es", wait=True)
            finally:
                release.join(timeout=30)
            assert not release.is_alive()
            renamed = page.locator(".messages li.renamed")
            expect(renamed).to_contain_text(f"Renamed {DIRECTORY} to /clinton/projects/es", timeout=LOCK_WAIT * 1000)
            expect(renamed).to_contain_text("(async view)")
            assert events == ["waiting", "released"], f"{events}: {renamed.inner_text()}"
            expect(page.locator('tr[data-path="/clinton/projects/es"]')).to_be_visible()
            expect(page.locator(f'tr[data-path="{DIRECTORY}"]')).to_have_count(0)
            expect(page.locator("#locks + p + p")).to_have_text("No lock is held here.")
            screenshot(page, "example-async-rename-done")
    finally:
        peer.close()
    assert fs.index.at("/clinton/projects/es/README.txt") is not None and fs.index.count(DIRECTORY) == 0
