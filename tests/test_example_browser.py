"""The example's page in a real browser: a directory rename refused while another process locks a file inside."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from example_project.fs.tree import README

from .browser import chromium_page, screenshot
from .example_support import example_fs
from .peer import Peer

DIRECTORY = "/clinton/projects/elasticsearch"


@pytest.fixture
def fs(es_url):
    with example_fs(es_url) as fs:
        fs.seed(300)
        yield fs


def submit_rename(page, path: str, to: str) -> None:
    row = page.locator(f'tr[data-path="{path}"]')
    row.locator("input[name=to]").fill(to)
    row.get_by_role("button", name="Rename", exact=True).click()


@pytest.mark.django_db(transaction=True)
def test_rename_a_directory_in_the_browser_while_a_file_inside_is_locked(fs, live_server):
    peer = Peer(fs.lock_config)
    try:
        assert "token" in peer.acquire("readme", scheme="tree", path=README, namespace="fs")
        pid = peer.pid()
        with chromium_page() as page:
            page.goto(f"{live_server.url}/browse/clinton/projects")
            expect(page.locator(f'.lock[data-path="{README}"]')).to_contain_text(f"pid {pid}")

            submit_rename(page, DIRECTORY, "es")
            conflict = page.locator(".messages li.conflict")
            expect(conflict).to_contain_text(f"Conflict: {DIRECTORY} cannot be renamed now")
            expect(conflict).to_contain_text(f"exclusive lock on {README} held by pid {pid}")
            expect(page.locator(f'tr[data-path="{DIRECTORY}"]')).to_be_visible()  # nothing changed
            expect(page.locator(f'.lock[data-path="{README}"]')).to_be_visible()
            screenshot(page, "example-rename-conflict")

            peer.release("readme")
            submit_rename(page, DIRECTORY, "es")
            expect(page.locator(".messages li.renamed")).to_contain_text(f"Renamed {DIRECTORY} to /clinton/projects/es")
            expect(page.locator('tr[data-path="/clinton/projects/es"]')).to_be_visible()
            expect(page.locator(f'tr[data-path="{DIRECTORY}"]')).to_have_count(0)
            expect(page.locator("#locks + p + p")).to_have_text("No lock is held here.")
            screenshot(page, "example-rename-done")
    finally:
        peer.close()
    assert fs.index.at("/clinton/projects/es/README.txt") is not None and fs.index.count(DIRECTORY) == 0
