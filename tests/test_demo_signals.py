"""manage.py demo as a user runs it: it says where the site is and how to stop it; Ctrl-C or SIGTERM stop noida
and the task worker."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from .stores import free_port

ROOT_DIR = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT = 180.0


def read_lines(process: subprocess.Popen) -> queue.Queue:
    """A queue of the process's output lines, None at its end, filled by a thread."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_for(lines: queue.Queue, text: str, seen: list[str]) -> None:
    while True:
        line = lines.get(timeout=STARTUP_TIMEOUT)
        assert line is not None, f"the demo exited before printing {text!r}:\n{''.join(seen)}"
        seen.append(line)
        if text in line:
            return


@pytest.fixture
def noida_dir(tmp_path):
    """The demo's noida-db data dir; a server a failed test left running there (in a session of its own) is stopped."""
    yield tmp_path / "noida"
    with contextlib.suppress(OSError, ValueError):
        os.kill(int((tmp_path / "noida" / "noida-server.pid").read_text()), signal.SIGTERM)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_demo_serves_then_stops_its_noida_db_on(signum, tmp_path, noida_dir):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"ELASTICSEARCH_URL", "LOCK_URL", "LOCK_BACKEND"}}
    # The fresh machine: SQLite for everything (not the tests' PostgreSQL), noida-db started by the demo.
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'example.sqlite3'}", PYTHONUNBUFFERED="1")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    demo = ["manage.py", "demo", f"127.0.0.1:{port}", "--files", "200", "--race-files", "100", "--race-rounds", "1"]
    demo += ["--data-dir", str(noida_dir), "--es-port", "0", "--no-race-tasks"]
    # As from a terminal: SIGINT at its default, which Python turns into KeyboardInterrupt. A test run
    # started in the background of a script (.ci/run's tox) inherits SIGINT ignored, and exec keeps that.
    restore = "import os, signal as s, sys; s.signal(s.SIGINT, s.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    command = [sys.executable, "-c", restore, sys.executable, *demo]
    process = subprocess.Popen(
        command, cwd=ROOT_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = read_lines(process)
        seen: list[str] = []
        wait_for(lines, "listening on ", seen)
        noida = seen[-1].split("listening on ")[1].split()[0]
        wait_for(lines, f"Open http://127.0.0.1:{port}/", seen)
        said = "".join(seen)  # seeded, then fs_race's text report (its numbers: tests/test_example_commands.py)
        assert "Seeding" in said and "Indexed" in said, said
        assert "no locks" in said and "no locks, versions" in said, said
        assert "With lock_tree: both renames applied in 1 of 1 rounds" in said, said
        wait_for(lines, "A task worker runs the renames", seen)
        worker_pid = int(seen[-1].rsplit("pid ", 1)[1].rstrip(".\n"))
        wait_for(lines, "Quit the server with CONTROL-C", seen)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as page:
            assert page.status == 200
        process.send_signal(signum)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    with pytest.raises(OSError):
        urllib.request.urlopen(noida, timeout=2)  # noida-db stopped with the demo
    assert not (noida_dir / "noida-server.pid").exists()
    with pytest.raises(ProcessLookupError):  # the task worker stopped with the demo (and was reaped by it)
        os.kill(worker_pid, 0)
