"""The reference pages name everything the code declares: every system check id, signal and setting key."""

import re
from pathlib import Path

from django_esdlock import conf, signals

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "docs" / "ref"


def test_every_check_id_is_on_the_checks_page():
    code = "\n".join(p.read_text() for p in (ROOT / "django_esdlock").rglob("*.py"))
    ids = set(re.findall(r'id="(django_esdlock\.[EW]\d{3})"', code))
    page = (REF / "checks.md").read_text()
    assert len(ids) >= 10
    assert {i for i in ids if f"`{i}`" not in page} == set()


def test_every_signal_is_on_the_signals_page():
    page = (REF / "signals.md").read_text()
    assert {name for name in signals._NAMES.values() if name not in page} == set()


def test_every_setting_key_is_on_the_settings_page():
    page = (REF / "settings.md").read_text()
    assert {key for key in conf._ALLOWED_KEYS if f"`{key}`" not in page} == set()
