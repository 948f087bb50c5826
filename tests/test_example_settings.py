"""The example project's settings come from the environment (django-environ), with embedded defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT_DIR = Path(__file__).resolve().parent.parent
NAMES = ["DEBUG", "SECRET_KEY", "ELASTICSEARCH_URL", "FS_INDEX", "LOCK_BACKEND", "DATABASES"]
PRINT_SETTINGS = (
    "import json; from django.conf import settings as s; "
    f"print(json.dumps({{n: getattr(s, n) for n in {NAMES!r}}}, default=str))"
)


def example_settings(**env: str) -> dict:
    """Return the example's settings as ``manage.py`` sees them with ``env`` (and nothing else of ours) set."""
    clean = {k: v for k, v in os.environ.items() if k not in {*NAMES, "DATABASE_URL", "LOCK_URL"}}
    clean["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", PRINT_SETTINGS],
        cwd=ROOT_DIR,
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_defaults_are_the_embedded_setup():
    settings = example_settings()
    assert settings["DEBUG"] is True and settings["ELASTICSEARCH_URL"] == "" and settings["FS_INDEX"] == "fs"
    assert settings["DATABASES"]["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert settings["DATABASES"]["default"]["NAME"].endswith("example.sqlite3")
    assert settings["LOCK_BACKEND"]["BACKEND"] == "django_esdlock.backends.database.DatabaseLockBackend"


def test_everything_can_come_from_the_environment(tmp_path):
    settings = example_settings(
        DEBUG="false",
        SECRET_KEY="from-the-env",
        DATABASE_URL=f"sqlite:///{tmp_path}/other.sqlite3",
        ELASTICSEARCH_URL="http://es.example:9200",
        FS_INDEX="files",
        LOCK_URL="elasticsearch://es.example:9200/locks",
    )
    assert settings["DEBUG"] is False and settings["SECRET_KEY"] == "from-the-env"
    assert settings["DATABASES"]["default"]["NAME"] == f"{tmp_path}/other.sqlite3"
    assert settings["ELASTICSEARCH_URL"] == "http://es.example:9200" and settings["FS_INDEX"] == "files"
    assert settings["LOCK_BACKEND"] == "elasticsearch://es.example:9200/locks"
    assert example_settings(LOCK_BACKEND="postgres://u@db/locks")["LOCK_BACKEND"] == "postgres://u@db/locks"
