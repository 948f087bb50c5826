"""A second process that takes and releases locks on command, for cross-process tests."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import traceback
from typing import Any

SPAWN = multiprocessing.get_context("spawn")


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def build_lock(config: dict, spec: dict, backend=None):
    """Build a Lock from a plain spec: ``{"scheme": "tree"|"documents"|"global"|"semaphore"|"raw", ...}``.

    ``backend`` defaults to a new one on ``config``.
    """
    from django_esdlock.conf import load_backend
    from django_esdlock.locks import Lock, global_lock, lock_documents, lock_tree, semaphore
    from django_esdlock.modes import Mode
    from django_esdlock.records import Kind, Node

    if backend is None:
        backend = load_backend(config)
    kwargs = {k: spec[k] for k in ("timeout", "ttl") if k in spec}
    scheme = spec["scheme"]
    if scheme == "tree":
        return lock_tree(
            spec["path"],
            shared=spec.get("shared", False),
            namespace=spec.get("namespace", "default"),
            intent=spec.get("intent"),
            backend=backend,
            **kwargs,
        )
    if scheme == "documents":
        return lock_documents(spec["ids"], namespace=spec.get("namespace", "default"), backend=backend, **kwargs)
    if scheme == "global":
        return global_lock(spec.get("name", "global"), backend=backend, **kwargs)
    if scheme == "semaphore":
        namespace = spec.get("namespace", "default")
        intent = spec.get("intent")
        return semaphore(spec["name"], spec["limit"], namespace=namespace, intent=intent, backend=backend, **kwargs)
    if scheme == "raw":  # one node in one mode, to test single cells of the matrix
        node = Node(spec.get("namespace", "default"), Kind.TREE, spec["path"])
        return Lock(((node, Mode(spec["mode"])),), backend=backend, **kwargs)
    raise ValueError(scheme)


def _serve(config: dict, conn) -> None:
    setup_django()
    from django_esdlock.conf import load_backend
    from django_esdlock.exceptions import LockBackendUnavailable, LockError

    held: dict[str, Any] = {}
    backend = None  # one per test: a reset closes it, so nothing a test left in it reaches the next

    def give_back() -> None:
        nonlocal backend
        for lock in held.values():
            with contextlib.suppress(LockError):
                lock.release()
        held.clear()
        if backend is not None:
            backend.close()
            backend = None

    while True:
        command, args = conn.recv()
        try:
            if command == "stop":
                give_back()
                conn.send(("ok", None))
                return
            if command == "reset":
                give_back()
                conn.send(("ok", None))
            elif command == "acquire":
                name, spec = args
                if backend is None:
                    backend = load_backend(config)
                lock = build_lock(config, spec, backend)
                try:
                    lock.acquire()
                except LockBackendUnavailable:
                    raise  # a broken store is never the outcome a test waits for: report it whole
                except LockError as e:
                    conn.send(("ok", type(e).__name__))
                    continue
                held[name] = lock
                conn.send(("ok", {"token": lock.token, "holder_id": lock.holder_id}))
            elif command == "release":
                held.pop(args).release()
                conn.send(("ok", None))
            elif command == "lost":
                conn.send(("ok", held[args].lost))
            elif command == "pid":
                conn.send(("ok", os.getpid()))
            else:
                raise ValueError(command)
        except Exception:  # noqa: BLE001 - report it to the test process
            conn.send(("error", traceback.format_exc()))


class Peer:
    """Another process with its own owner identity, driven through a pipe."""

    def __init__(self, config: dict) -> None:
        self._conn, child = SPAWN.Pipe()
        self.process = SPAWN.Process(target=_serve, args=(config, child), daemon=True)
        self.process.start()
        child.close()  # the peer's end is its alone now: its death reads as EOF at once

    def _call(self, command: str, args: Any = None, timeout: float = 60) -> Any:
        try:
            self._conn.send((command, args))
            if not self._conn.poll(timeout):
                raise TimeoutError(f"peer did not answer {command} within {timeout}s")
            status, value = self._conn.recv()
        except (EOFError, BrokenPipeError):
            self.process.join(timeout=5)
            raise AssertionError(f"peer exited with {self.process.exitcode} before answering {command}") from None
        if status == "error":
            raise AssertionError(f"peer failed on {command}:\n{value}")
        return value

    def acquire(self, name: str, /, **spec: Any) -> Any:
        """Return {"token", "holder_id"} on success, else the exception's class name."""
        return self._call("acquire", (name, spec))

    def release(self, name: str) -> None:
        self._call("release", name)

    def is_lost(self, name: str) -> bool:
        return self._call("lost", name)

    def pid(self) -> int:
        return self._call("pid")

    def reset(self) -> None:
        """Release everything this peer holds and drop its backend: it is then as good as a new one."""
        self._call("reset", timeout=30)

    def close(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(TimeoutError, OSError, EOFError):
                self._call("stop", timeout=30)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
