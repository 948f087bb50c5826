"""Deploys never wait on the lock store: migrate passes while it is down; ``check --deploy`` reports it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .stores import ES_BACKEND, free_port

DB_BACKEND = "django_esdlock.backends.database.DatabaseLockBackend"
ROOT = Path(__file__).resolve().parent.parent

SETTINGS = """
SECRET_KEY = "deploy-test-not-secret"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_esdlock"]
DATABASES = {databases!r}
LOCK_BACKEND = {lock_backend!r}
"""


def _down_stores(tmp_path: Path) -> dict[str, tuple[dict, object]]:
    """Each store kind, down: name -> (extra DATABASES, LOCK_BACKEND). Nothing listens on the ports."""
    dead_pg = {"ENGINE": "django.db.backends.postgresql", "HOST": "127.0.0.1", "PORT": free_port(), "NAME": "locks"}
    return {
        "elasticsearch": ({}, {"BACKEND": ES_BACKEND, "OPTIONS": {"hosts": [f"http://127.0.0.1:{free_port()}"]}}),
        "postgres_url": ({}, f"postgres://postgres@127.0.0.1:{free_port()}/locks"),
        "postgres_alias": ({"locks": dead_pg}, {"BACKEND": DB_BACKEND, "OPTIONS": {"using": "locks"}}),
        "sqlite": ({}, f"sqlite:///{tmp_path}/no-such-directory/locks.sqlite3"),
    }


@pytest.mark.parametrize("store", ["elasticsearch", "postgres_url", "postgres_alias", "sqlite"])
def test_migrate_passes_with_the_lock_store_down_and_check_deploy_reports_it(store, tmp_path):
    extra, lock_backend = _down_stores(tmp_path)[store]
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "app.sqlite3")}, **extra}
    (tmp_path / "deploy_settings.py").write_text(SETTINGS.format(databases=databases, lock_backend=lock_backend))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "PYTHONWARNINGS": "ignore"}
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "django", *args, "--settings=deploy_settings"]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    migrate = manage("migrate", "--verbosity=0")
    assert migrate.returncode == 0, migrate.stderr
    assert (tmp_path / "app.sqlite3").exists()  # it did migrate Django's database

    check = manage("check", "--deploy", "--tag=django_esdlock")
    assert check.returncode == 1 and "django_esdlock.E002" in check.stderr, check.stderr
    assert "django_esdlock.E001" not in check.stderr  # the settings are fine: only the store is down
