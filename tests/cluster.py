"""The genuine three-node Elasticsearch cluster of ../shared/elasticsearch, for failover tests: find, kill, restart."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[2] / "shared" / "elasticsearch"
START = Path(os.environ.get("ESDLOCK_ES_SHARED", SHARED)) / "start-cluster"
HOME = Path(os.environ.get("ESDLOCK_ES_CLUSTER", "/tmp/esdlock-es-cluster"))
NODES = (1, 2, 3)


def hosts() -> list[str]:
    """The proxies' URLs the cluster tests use (ELASTICSEARCH_HOSTS), or [] when none is configured."""
    return [h for h in os.environ.get("ELASTICSEARCH_HOSTS", "").split(",") if h]


def request(path: str, *, method: str = "GET", body: Any = None, timeout: float = 10.0, nodes=NODES) -> Any:
    """Ask the first of ``nodes`` (directly, not through a proxy) that answers; return the decoded JSON."""
    return first_answer([f"http://127.0.0.1:930{i}" for i in nodes], path, method=method, body=body, timeout=timeout)


def first_answer(bases: list[str], path: str, *, method: str = "GET", body: Any = None, timeout: float = 10.0) -> Any:
    """Send the request to each base URL in turn until one answers; return its decoded JSON.

    An HTTP error fails at once (the node answered); a node that cannot be reached is passed over.
    """
    data = None if body is None else json.dumps(body).encode()
    last: Exception | None = None
    for base in bases:
        req = urllib.request.Request(
            base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {base}{path}: {e.code} {e.read()[:500]!r}") from e
        except OSError as e:
            last = e
    raise AssertionError(f"none of {bases} answered {method} {path}: {last}")


def alive(i: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:930{i}/", timeout=2):
            return True
    except OSError:
        return False


def wait_for(nodes: int = 3, *, status: str | None = None, timeout: float = 90.0, index: str | None = None) -> None:
    """Wait until the cluster has ``nodes`` nodes (and ``status`` for ``index``, or all); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    path = f"/_cluster/health/{index or ''}?wait_for_nodes={nodes}&timeout=5s"
    if status:
        path += f"&wait_for_status={status}"
    while time.monotonic() < deadline:
        try:
            health = request(path, timeout=10)
        except AssertionError:
            time.sleep(0.5)
            continue
        if not health.get("timed_out"):
            return
    raise AssertionError(f"the cluster did not reach {nodes} nodes {status or ''} within {timeout:g}s")


def primary_node(index: str) -> int:
    """Return the number of the node holding ``index``'s primary shard."""
    for row in request(f"/_cat/shards/{index}?format=json"):
        if row["prirep"] == "p" and row["state"] == "STARTED":
            return int(row["node"].removeprefix("n"))
    raise AssertionError(f"{index} has no started primary")


def master_node() -> int:
    (row,) = request("/_cat/master?format=json")
    return int(row["node"].removeprefix("n"))


def concrete(index: str) -> str:
    """The one concrete index ``index`` names: a lock index is an alias of ``<index>.floor-<N>``."""
    if ".floor-" in index:
        return index
    (name,) = request(f"/{index}/_alias")
    return name


def primary_term(index: str) -> int:
    """Return the primary term of ``index``'s shard 0: it grows with every new primary."""
    name = concrete(index)
    state = request(f"/_cluster/state/metadata/{name}")
    return int(state["metadata"]["indices"][name]["primary_terms"]["0"])


def node_pid(i: int) -> int:
    """Return the pid of node ``i``: its es.pid, else the JVM whose ``es.path.conf`` is the node's config.

    A node started again after a SIGKILL does not always leave an es.pid
    (the dead one's stale file is in the way), hence the second look.
    """
    pid_file = HOME / f"n{i}" / "es.pid"
    if pid_file.exists():
        return int(pid_file.read_text())
    wanted = f"-Des.path.conf={HOME / f'n{i}' / 'config'}".encode()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and wanted in (proc / "cmdline").read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:
            continue
    raise AssertionError(f"no process of node n{i}")


def kill(i: int) -> None:
    """SIGKILL node ``i`` (no goodbye to the cluster: its sockets just close) and wait until it is gone."""
    os.kill(node_pid(i), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(i) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(i), f"node n{i} still answers after SIGKILL"


def restart(i: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start node ``i`` again, in the background (``env`` added to its environment); :func:`finish` waits for it."""
    return subprocess.Popen(
        [str(START), "--node", str(i)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def finish(process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Wait for a :func:`restart` to end; fail with its output if it did not bring the node up."""
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate(timeout=10)
    assert process.returncode == 0, f"start-cluster failed: {err.decode(errors='replace')[-2000:]}"


def make_whole(timeout: float = 150.0) -> None:
    """Start whichever nodes are down and wait until all three are in the cluster."""
    down = [i for i in NODES if not alive(i)]
    for process in [restart(i) for i in down]:
        finish(process, timeout)
    wait_for(3, timeout=timeout)


ES_BACKEND = "django_esdlock.backends.elasticsearch.ElasticsearchLockBackend"


@contextlib.contextmanager
def lock_configs() -> Iterator[Callable[..., dict]]:
    """Yield ``make(ttl, **options)``, which returns :func:`lock_config`; at the end, the cluster whole again and
    the lock indices made dropped."""
    made: list[dict] = []

    def make(ttl: float, **options: Any) -> dict:
        made.append(lock_config(ttl, **options))
        return made[-1]

    yield make
    make_whole()
    for config in made:
        drop_lock_index(config)


def lock_config(ttl: float, **options: Any) -> dict:
    """A LOCK_BACKEND of a fresh lock index on the cluster (``options``: more OPTIONS, ``hosts`` included)."""
    index = f"test-cluster-{uuid.uuid4().hex[:10]}"
    return {"BACKEND": ES_BACKEND, "OPTIONS": {"hosts": hosts(), "index": index, **options}, "TTL": ttl}


def drop_lock_index(config: dict) -> None:
    """Delete the indices the lock index of ``config`` names (it is an alias of ``<index>.floor-<N>``)."""
    concrete = request(f"/{config['OPTIONS']['index']}/_alias?ignore_unavailable=true", timeout=30) or {}
    for name in concrete:
        request(f"/{name}", method="DELETE", timeout=30)


# --- A node's wall clock set off, as NTP skew is: libfaketime in its JVM, the offset read from a file.

FAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)
"""libfaketime (Debian's ``libfaketime``), or None where it is missing."""


def clock_file(i: int) -> Path:
    return HOME / f"n{i}" / "clock-offset"


def restart_with_settable_clock(i: int) -> None:
    """Restart node ``i`` with libfaketime, its wall-clock offset read from :func:`clock_file` (0 at first).

    Only the wall clock moves: ``DONT_FAKE_MONOTONIC`` leaves ``CLOCK_MONOTONIC``
    (the JVM's ``System.nanoTime``, its timed waits) alone, as NTP does. The
    file is read again each second (``FAKETIME_CACHE_DURATION``), so
    :func:`set_clock_offset` moves the clock of the running node.
    """
    assert FAKETIME, "libfaketime is missing"
    clock_file(i).write_text("+0s\n")
    clock_file(i).chmod(0o644)
    kill(i)
    (HOME / f"n{i}" / "es.pid").unlink(missing_ok=True)
    env = {
        "LD_PRELOAD": FAKETIME,
        "FAKETIME_TIMESTAMP_FILE": str(clock_file(i)),
        "FAKETIME_CACHE_DURATION": "1",
        "DONT_FAKE_MONOTONIC": "1",
    }
    finish(restart(i, env))
    wait_for(3)


def clock_offsets() -> dict[str, float]:
    """Each node's wall clock less this machine's, in seconds, as one ``_nodes/stats/os`` reports them."""
    before = time.time()
    nodes = request("/_nodes/stats/os")["nodes"].values()
    middle = (before + time.time()) / 2
    return {node["name"]: node["os"]["timestamp"] / 1000 - middle for node in nodes}


def set_clock_offset(i: int, seconds: int, timeout: float = 20.0) -> None:
    """Set node ``i``'s wall clock ``seconds`` off (a node started by :func:`restart_with_settable_clock`).

    Waits until the node reports it (libfaketime reads the file each second;
    the node's stats are cached up to a second more).
    """
    clock_file(i).write_text(f"{seconds:+d}s\n")
    deadline = time.monotonic() + timeout
    while abs((seen := clock_offsets()[f"n{i}"]) - seconds) > 0.5:
        assert time.monotonic() < deadline, f"node n{i}'s clock is {seen:+.3f}s off, not {seconds:+d}s"
        time.sleep(0.3)
