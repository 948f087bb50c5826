"""Debian's Chromium driven by Playwright, for the browser tests."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = os.environ.get("ESDLOCK_CHROMIUM") or "/usr/bin/chromium"
MISSING = (
    f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium; ./runtests does it as root), "
    "or point ESDLOCK_CHROMIUM at a Chromium"
)
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_present() -> bool:
    return shutil.which(CHROMIUM) is not None


@contextlib.contextmanager
def chromium_page() -> Iterator:
    """Yield a Playwright page of a headless Debian Chromium (never a downloaded browser)."""
    if not chromium_present():
        raise RuntimeError(MISSING)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; Django's ORM calls
    # from the test body would otherwise be refused as "async unsafe".
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            yield page
        finally:
            browser.close()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
