"""A store connection that stops answering: a loopback proxy that holds every byte, or SQLite calls that hang."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

from django_esdlock.backends.database import DatabaseLockBackend
from django_esdlock.checker.proxy import Proxy

from .dbstores import url_of, with_port

HERE = __name__


class StallingDatabaseBackend(DatabaseLockBackend):
    """A database backend whose every call hangs while its ``stall_file`` exists: SQLite's black hole.

    A SQLite store has no connection to cut; a call that hangs is what a
    black-holed connection does to a client (the store itself is untouched).
    ``<stall_file>.entered`` is created when a call starts hanging.
    """

    def __init__(self, *, stall_file: str, **options: Any) -> None:
        super().__init__(**options)
        self.stall_file = stall_file

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        if os.path.exists(self.stall_file):
            with open(self.stall_file + ".entered", "a"):
                pass
            while os.path.exists(self.stall_file):
                time.sleep(0.005)
        return super()._run(*args, **kwargs)


class Hole:
    """Controls one black hole: :meth:`open` it, :meth:`close` it, see whether a call is caught in it."""

    def __init__(self, proxy: Proxy | None, stall_file: str | None) -> None:
        self.proxy = proxy
        self.stall_file = stall_file

    def open(self) -> None:
        if self.proxy is not None:
            self.proxy.black_hole()
        else:
            assert self.stall_file is not None
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.stall_file + ".entered")
            with open(self.stall_file, "w"):
                pass

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.resume()
        else:
            assert self.stall_file is not None
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.stall_file)

    def caught(self) -> bool:
        """Whether a call went in since :meth:`open` (and hangs there)."""
        if self.proxy is not None:
            return self.proxy.held > 0
        assert self.stall_file is not None
        return os.path.exists(self.stall_file + ".entered")


@contextlib.contextmanager
def black_holed(config: dict) -> Iterator[tuple[dict, Hole]]:
    """Yield a config of the same store whose connection can be black-holed, and its :class:`Hole`.

    Elasticsearch and PostgreSQL go through a loopback :class:`Proxy` (which
    holds bytes both ways and keeps every socket open); SQLite through
    :class:`StallingDatabaseBackend`.
    """
    config = copy.deepcopy(config)
    options = config["OPTIONS"]
    if "hosts" in options:
        parts = urllib.parse.urlsplit(options["hosts"][0])
        proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 9200)
        options["hosts"] = [f"{parts.scheme}://127.0.0.1:{proxy.port}"]
        hole = Hole(proxy, None)
    elif url_of(config).startswith("sqlite"):
        directory = tempfile.mkdtemp(prefix="esdlock-hole-")  # removed below
        config["BACKEND"] = f"{HERE}.StallingDatabaseBackend"
        options["stall_file"] = os.path.join(directory, "stall")
        hole = Hole(None, options["stall_file"])
    else:
        parts = urllib.parse.urlsplit(url_of(config))
        proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        options["url"] = with_port(url_of(config), "127.0.0.1", proxy.port)
        hole = Hole(proxy, None)
    try:
        yield config, hole
    finally:
        hole.close()
        if hole.proxy is not None:
            hole.proxy.close()
        else:
            shutil.rmtree(os.path.dirname(options["stall_file"]), ignore_errors=True)
