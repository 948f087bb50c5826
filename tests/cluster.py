"""The genuine three-node Elasticsearch cluster of ../shared/elasticsearch, for failover tests: find, kill, restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
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
    data = None if body is None else json.dumps(body).encode()
    last: Exception | None = None
    for i in nodes:
        req = urllib.request.Request(
            f"http://127.0.0.1:930{i}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from e
        except OSError as e:
            last = e
    raise AssertionError(f"no node of {nodes} answered {method} {path}: {last}")


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


def restart(i: int) -> subprocess.Popen:
    """Start node ``i`` again, in the background; :func:`finish` waits for it."""
    return subprocess.Popen(
        [str(START), "--node", str(i)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
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
