"""Without prometheus-client and opentelemetry-api a lock works; with them, the parts using them load at the first lock.

(elasticsearch-py imports opentelemetry itself when it is installed, for spans of its own: so what is
checked is which of our modules that import the libraries were loaded.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from .dbstores import sqlite_store

PROGRAM = textwrap.dedent(
    """
    import json, sys
    if sys.argv[2] == "absent":
        for name in ("prometheus_client", "opentelemetry"):
            sys.modules[name] = None  # an import of it raises ImportError: as if not installed
    from tests.peer import setup_django
    setup_django()
    import django_esdlock
    ours = ("django_esdlock.observability.metrics", "django_esdlock.observability.tracing")
    imported_early = sorted(m for m in ours if sys.modules.get(m))
    from django_esdlock import lock_tree
    from django_esdlock.conf import load_backend
    backend = load_backend(json.loads(sys.argv[1]))
    with lock_tree("/absent", backend=backend) as lock:
        token = lock.token
    backend.close()
    imported = sorted(m.rpartition(".")[2] for m in ours if sys.modules.get(m))
    print(json.dumps({"token": token, "early": imported_early, "imported": imported}))
    """
)


def _run(config: dict, libraries: str) -> dict:
    import json

    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(config), libraries],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def config(django_db_blocker):
    with django_db_blocker.unblock(), sqlite_store() as config:
        yield config


def test_a_lock_works_with_neither_library(config):
    outcome = _run(config, "absent")
    assert outcome["token"] is not None and outcome["imported"] == []


def test_installed_libraries_are_imported_at_the_first_lock_not_before(config):
    outcome = _run(config, "installed")
    assert outcome["early"] == [] and outcome["imported"] == ["metrics", "tracing"]
