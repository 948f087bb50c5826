"""The admin page in a real browser: log in, see another process's lock, force-release it."""

from __future__ import annotations

import pytest

from .admin_support import staff_user
from .browser import chromium_page, screenshot
from .contract import all_holders


@pytest.fixture
def lock_config(store_config, settings):
    settings.LOCK_BACKEND = store_config
    return store_config


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
