"""The admin pages in a real browser: see another process's lock and force-release it; see a deadlock."""

from __future__ import annotations

import pytest

from .admin_support import staff_user
from .browser import chromium_page, screenshot
from .contract import all_holders
from .waiting_state import leave_a_deadlock


@pytest.fixture(params=["elasticsearch"])
def lock_config(request, shared_stores, settings):
    """One store: the pages show what any backend reports, and tests/test_admin.py proves them on every store."""
    config = shared_stores.get(request.param)
    settings.LOCK_BACKEND = config
    return config


@pytest.mark.django_db(transaction=True)
def test_force_release_in_the_browser(live_server, django_user_model, lock_config, peer, backend):
    staff_user(django_user_model, "operator", "view_heldlock", "delete_heldlock")
    peer.acquire("rename", scheme="tree", path="/clinton/projects/README.txt", namespace="fs")
    with chromium_page() as page:
        page.goto(f"{live_server.url}/admin/login/?next=/admin/django_esdlock/heldlock/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        row = page.locator("tr.holder[data-path='/clinton/projects/README.txt']")
        row.wait_for()
        assert "X" in row.locator(".esdlock-mode").inner_text()
        screenshot(page, "admin-held-locks")
        row.locator("input[type=checkbox]").check()
        page.click("#esdlock-release")
        page.wait_for_selector("#esdlock-confirm")
        screenshot(page, "admin-release-confirmation")
        page.click("#esdlock-confirm")
        page.wait_for_selector(".messagelist")
        assert "Released 1 holder." in page.locator(".messagelist").inner_text()
        assert page.locator("tr.holder[data-path='/clinton/projects/README.txt']").count() == 0
        screenshot(page, "admin-after-release")
    assert all_holders(backend) == []


@pytest.mark.django_db(transaction=True)
def test_waiting_page_in_the_browser(live_server, django_user_model, lock_config, backend):
    staff_user(django_user_model, "watcher", "view_heldlock")
    victim = leave_a_deadlock(backend)
    with chromium_page() as page:
        page.goto(f"{live_server.url}/admin/login/?next=/admin/django_esdlock/heldlock/")
        page.fill("#id_username", "watcher")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.click("#esdlock-waiting-link")
        page.wait_for_selector("#esdlock-waiting")
        assert page.locator("tr.waiting[data-cycle=yes]").count() == 2
        assert page.locator(f"#esdlock-cycles li[data-victim='{victim}']").count() == 1
        assert "victim" in page.locator(f"#request-{victim}").inner_text()
        assert page.locator("#esdlock-graph line.esdlock-arrow-cycle").count() == 2
        screenshot(page, "admin-waiting")
