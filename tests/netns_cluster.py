"""A genuine three-node Elasticsearch 7.0 cluster, each node in a network namespace of its own, cut apart with tc.

The partition tests' harness (tests/test_elasticsearch_partitions.py); it leaves the loopback
cluster of ../shared/elasticsearch/start-cluster alone. What it builds, all removed by
:meth:`NetnsCluster.stop` (and, stale from an aborted run, by :meth:`NetnsCluster.start`):

- a bridge ``esdlock-pbr`` in the root namespace with an address in a private /24 that no
  address or route of this machine overlaps (``.1``), so the tests and lock_check's workers
  reach every node from the root namespace whatever the nodes' cuts;
- namespaces ``esdlock-p1`` … ``esdlock-p3``, each joined to the bridge by a veth pair
  (``esdlock-pv<i>`` outside, ``eth0`` inside) with two addresses: ``.1<i>`` of the bridge's
  subnet for HTTP (9200), which the root namespace reaches, and ``127.<b>.<c>.1<i>`` for the
  transport (9300), which only the other nodes use. Elasticsearch enforces its bootstrap
  checks when the transport is bound to an address outside 127/8, and two of them cannot
  pass in this container: 65535 file descriptors (the hard limit is 20000 and root lacks
  CAP_SYS_RESOURCE) and vm.max_map_count 262144 (a machine-wide sysctl, 65530). A 127/8
  address on ``eth0`` is an ordinary address on the wire once ``route_localnet`` is on and
  the namespace's ``lo`` keeps only 127.0.0.1/32: the nodes talk over veths and the bridge
  like any others, and the node runs in development mode (the checks only warn);
- on each ``eth0`` an htb root qdisc whose default class passes everything and whose class
  1:2 ends in a ``pfifo limit 0``: a cut is a u32 filter that files the packets to a peer in
  1:2, where they are dropped. Dropped, not refused: the sender sees no error and no reset,
  its TCP retransmits into the void, as behind a failed switch (this kernel has no tc
  ``drop`` action and no iptables, and a blackhole route would fail a ``connect`` at once);
- a compat proxy (../shared/elasticsearch/compat_proxy.py, its upstream pointed at the
  node's address) per node on 127.0.0.1 of the root namespace: the URLs the clients use;
- one Elasticsearch directory under ``/tmp/esdlock-partitions`` (``ESDLOCK_PARTITION_HOME``),
  config, data and logs of each node below it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import cluster

SHARED = Path(os.environ.get("ESDLOCK_ES_SHARED", Path(__file__).resolve().parents[2] / "shared" / "elasticsearch"))
TARBALL = SHARED / "elasticsearch-7.0.0-oss.tar.gz"
COMPAT_PROXY = SHARED / "compat_proxy.py"
HOME = Path(os.environ.get("ESDLOCK_PARTITION_HOME", "/tmp/esdlock-partitions"))
JAVA_HOME = Path(os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64"))
ES_USER = "esdlock-es"
PREFIX = "esdlock-p"
BRIDGE = f"{PREFIX}br"
NODES = (1, 2, 3)
HTTP_PORT, TRANSPORT_PORT = 9200, 9300
SUBNETS = ("10.213.47.0/24", "10.213.147.0/24", "172.30.213.0/24", "192.168.213.0/24")
"""Candidate subnets for the bridge; the first that overlaps no address or route of this machine is used."""
TOOLS = ("ip", "tc", "runuser", "useradd")

# Fault detection lowered so that a node cut off by dropped packets is noticed in seconds (defaults in brackets):
# the master's follower checks and each follower's leader checks go unanswered, not refused, so each waits its
# timeout; three lost in a row (1 s apart) [1 s, 10 s, 3] remove a follower or make a follower drop its leader
# after about 3 x (1 s + 2 s). A reconnection to a silent peer waits transport.connect_timeout [30 s]; peer
# discovery asks each seed within discovery.request_peers_timeout [3 s]. A publication waits for the slow nodes'
# acks at most cluster.publish.timeout [30 s] before the next one may start; a node that lags behind the
# committed state is removed after cluster.follower_lag.timeout [90 s].
FAULT_DETECTION = {
    "cluster.fault_detection.follower_check.interval": "1s",
    "cluster.fault_detection.follower_check.timeout": "2s",
    "cluster.fault_detection.follower_check.retry_count": 3,
    "cluster.fault_detection.leader_check.interval": "1s",
    "cluster.fault_detection.leader_check.timeout": "2s",
    "cluster.fault_detection.leader_check.retry_count": 3,
    "transport.connect_timeout": "2s",
    "discovery.request_peers_timeout": "2s",
    "cluster.publish.timeout": "10s",
    "cluster.follower_lag.timeout": "20s",
}

TCP_RETRIES2 = 5
"""``net.ipv4.tcp_retries2`` in each node's namespace (Linux: 15, about 15 minutes).

A request already sent on a connection whose peer has gone silent (a
replication to a replica cut off from its primary while the master still
sees both) waits for TCP to give up: no Elasticsearch timeout covers it.
Elasticsearch's own docs ("TCP retransmission timeout") recommend 5, about
13 s; the namespace's value, not the machine's, is set.
"""

_PROXY_MAIN = """
import importlib.util, sys
from http.server import ThreadingHTTPServer
path, listen, host, port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sys.argv = [path, str(listen), str(port)]
spec = importlib.util.spec_from_file_location("compat_proxy", path)
proxy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(proxy)
proxy.UPSTREAM = (host, port)  # the shared proxy forwards to 127.0.0.1 of its own namespace; ours to the node
ThreadingHTTPServer(("127.0.0.1", listen), proxy.Handler).serve_forever()
"""


def missing() -> str:
    """Why the partition cluster cannot be built here, or "" when it can."""
    if not TARBALL.exists():
        return f"no ../shared/elasticsearch (the genuine Elasticsearch 7.0 tarball {TARBALL} is missing)"
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, the nodes run as esdlock-es)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"needs {', '.join(absent)} (iproute2, util-linux)"
    if not (JAVA_HOME / "bin" / "java").exists():
        return f"no Java at {JAVA_HOME} (JAVA_HOME)"
    return ""


def run(*args: str, timeout: float = 20.0, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command (no shell); fail with its output if ``check`` and it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode:
        raise AssertionError(f"{' '.join(args)}: exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done


def _in(ns: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    return run("ip", "netns", "exec", ns, *args, **kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_subnet() -> ipaddress.IPv4Network:
    """The first of :data:`SUBNETS` that overlaps no address and no route (any table) of the root namespace."""
    used = []
    for entry in json.loads(run("ip", "-j", "-4", "addr").stdout or "[]"):
        for info in entry.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    for candidate in map(ipaddress.ip_network, SUBNETS):
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise AssertionError(f"every candidate subnet {SUBNETS} is in use on this machine")


class Node:
    """One node: its namespace, address, JVM and proxy."""

    def __init__(self, number: int, address: str, transport: str) -> None:
        self.number = number
        self.name = f"n{number}"
        self.ns = f"{PREFIX}{number}"
        self.veth = f"{PREFIX}v{number}"
        self.address = address
        self.transport = transport
        self.dir = HOME / self.name
        self.proxy_port = 0
        self.jvm: subprocess.Popen | None = None
        self.proxy: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The URL clients use: the compat proxy in the root namespace."""
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def direct(self) -> str:
        """The node's own HTTP address (no proxy), reachable from the root namespace over the bridge."""
        return f"http://{self.address}:{HTTP_PORT}"


class NetnsCluster:
    """Build, start, cut, heal and remove the cluster; see the module docstring."""

    def __init__(self) -> None:
        self.subnet: ipaddress.IPv4Network | None = None
        self.nodes: dict[int, Node] = {}
        self.cuts: set[frozenset[int]] = set()

    # --- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        """Remove what an aborted run left, build the network, start the nodes and proxies; wait for 3 nodes."""
        remove_stale()
        self.subnet = pick_subnet()
        hosts = list(self.subnet.hosts())
        gateway = hosts[0]
        b, c = str(self.subnet.network_address).split(".")[1:3]
        self.nodes = {i: Node(i, str(hosts[10 + i - 1]), f"127.{b}.{c}.{10 + i}") for i in NODES}  # .11, .12, .13
        self._network(gateway)
        self._install()
        for node in self.nodes.values():
            self._start_node(node)
        for node in self.nodes.values():
            self._start_proxy(node)
        self.wait_for_nodes(3, timeout=timeout)

    def _network(self, gateway: ipaddress.IPv4Address) -> None:
        prefix = self.subnet.prefixlen
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{gateway}/{prefix}", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        for node in self.nodes.values():
            run("ip", "netns", "add", node.ns)
            run("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.ns)
            run("ip", "link", "set", node.veth, "master", BRIDGE, "up")
            run("ip", "-n", node.ns, "addr", "add", f"{node.address}/{prefix}", "dev", "eth0")
            # The transport's 127/8 address, routed over eth0 (see the module docstring).
            run("ip", "-n", node.ns, "addr", "add", "127.0.0.1/32", "dev", "lo")
            run("ip", "-n", node.ns, "link", "set", "lo", "up")  # which gives lo 127.0.0.1/8: all 127/8 local
            run("ip", "-n", node.ns, "addr", "del", "127.0.0.1/8", "dev", "lo")
            for scope in ("all", "eth0"):
                _in(node.ns, "sysctl", "-q", "-w", f"net.ipv4.conf.{scope}.route_localnet=1")
            run("ip", "-n", node.ns, "addr", "add", f"{node.transport}/24", "dev", "eth0")
            run("ip", "-n", node.ns, "link", "set", "eth0", "up")
            _in(node.ns, "sysctl", "-q", "-w", f"net.ipv4.tcp_retries2={TCP_RETRIES2}")
            # The cut's machinery, idle until a filter files packets in 1:2 (see the module docstring).
            _in(node.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1")
            for cls in ("1:1", "1:2"):
                _in(node.ns, "tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", cls, "htb", "rate",
                    "10gbit", "quantum", "200000")  # fmt: skip
            _in(node.ns, "tc", "qdisc", "add", "dev", "eth0", "parent", "1:2", "handle", "20:", "pfifo", "limit", "0")

    def _install(self) -> None:
        HOME.mkdir(parents=True, exist_ok=True)
        run("tar", "xzf", str(TARBALL), "-C", str(HOME), timeout=120)
        es_home = HOME / "elasticsearch-7.0.0"
        seeds = json.dumps([f"{n.transport}:{TRANSPORT_PORT}" for n in self.nodes.values()])
        for node in self.nodes.values():
            config = node.dir / "config"
            shutil.copytree(es_home / "config", config)
            (node.dir / "data").mkdir()
            (node.dir / "logs").mkdir()
            (node.dir / "tmp").mkdir()
            options = (config / "jvm.options").read_text()
            options = options.replace("-Xms512m", "-Xms384m").replace("-Xmx512m", "-Xmx384m")
            options = options.replace("HeapDumpPath=data", f"HeapDumpPath={node.dir}/data")
            options = options.replace("logs/", f"{node.dir}/logs/")
            (config / "jvm.options").write_text(options)
            settings = {
                "cluster.name": "esdlock-partitions",
                "node.name": node.name,
                "network.host": node.address,
                "transport.host": node.transport,
                "http.port": HTTP_PORT,
                "transport.port": TRANSPORT_PORT,
                "path.data": str(node.dir / "data"),
                "path.logs": str(node.dir / "logs"),
                "discovery.seed_hosts": seeds,
                "cluster.initial_master_nodes": json.dumps([n.name for n in self.nodes.values()]),
                "indices.breaker.total.use_real_memory": "false",
                "cluster.routing.allocation.disk.threshold_enabled": "false",
                **FAULT_DETECTION,
            }
            (config / "elasticsearch.yml").write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
        if run("id", "-u", ES_USER, check=False).returncode:
            run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ES_USER)
        run("chown", "-R", ES_USER, str(HOME))

    def _start_node(self, node: Node) -> None:
        es_home = HOME / "elasticsearch-7.0.0"
        command = [
            "ip", "netns", "exec", node.ns, "runuser", "-u", ES_USER, "--", "env", f"JAVA_HOME={JAVA_HOME}",
            f"ES_PATH_CONF={node.dir}/config", f"ES_TMPDIR={node.dir}/tmp", f"{es_home}/bin/elasticsearch",
            "-p", f"{node.dir}/es.pid",
        ]  # fmt: skip
        with open(node.dir / "console.log", "wb") as log:
            node.jvm = subprocess.Popen(
                command,
                cwd=es_home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _start_proxy(self, node: Node) -> None:
        node.proxy_port = _free_port()
        with open(node.dir / "proxy.log", "wb") as log:
            # HOME last: how remove_stale knows an orphaned proxy.
            args = [_PROXY_MAIN, str(COMPAT_PROXY), str(node.proxy_port), node.address, str(HTTP_PORT), str(HOME)]
            node.proxy = subprocess.Popen(
                [sys.executable, "-c", *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (node.dir / "proxy.pid").write_text(str(node.proxy.pid))
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", node.proxy_port), timeout=1):
                return
            assert node.proxy.poll() is None, f"the proxy of {node.name} exited: {(node.dir / 'proxy.log').read_text()}"
            assert time.monotonic() < deadline, f"the proxy of {node.name} does not listen"
            time.sleep(0.05)

    def stop(self, keep_logs: Path | None = None) -> None:
        """End the JVMs and proxies, remove namespaces, links, bridge and directory, whatever state it is in;
        first copy each node's logs into ``keep_logs`` if given."""
        if keep_logs is not None:
            for node in self.nodes.values():
                for log in [node.dir / "console.log", node.dir / "proxy.log", *node.dir.glob("logs/*.log")]:
                    with contextlib.suppress(OSError):
                        shutil.copy(log, keep_logs / f"{node.name}-{log.name}")
        for node in self.nodes.values():
            for process in (node.proxy, node.jvm):
                if process is not None and process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=10)
        remove_stale()

    def bootstrap_alone(self, i: int, timeout: float = 120.0) -> None:
        """Restart node ``i`` as a cluster of its own: its data path wiped, ``cluster.initial_master_nodes`` naming
        it alone and no seed hosts. The misconfiguration Elasticsearch 7's bootstrapping warns against (the 6.x
        ``minimum_master_nodes`` of Jepsen's split brains): two clusters of one name, both answering clients.
        """
        node = self.nodes[i]
        assert node.jvm is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.jvm.pid, signal.SIGKILL)
        node.jvm.wait(timeout=30)
        (node.dir / "es.pid").unlink(missing_ok=True)
        shutil.rmtree(node.dir / "data")
        (node.dir / "data").mkdir()
        config = node.dir / "config" / "elasticsearch.yml"
        lines = [
            line for line in config.read_text().splitlines() if not line.startswith(("discovery.", "cluster.init"))
        ]
        lines += ["discovery.seed_hosts: []", f'cluster.initial_master_nodes: ["{node.name}"]']
        config.write_text("\n".join(lines) + "\n")
        run("chown", "-R", ES_USER, str(node.dir))
        self._start_node(node)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(AssertionError):
                if self.local_view(i, timeout=2).get("master") == node.name:
                    return
            assert node.jvm.poll() is None, f"{node.name} exited: {self.console(i)}"
            assert time.monotonic() < deadline, f"{node.name} did not become a cluster of its own: {self.console(i)}"
            time.sleep(0.5)

    # --- the cuts -------------------------------------------------------------------------

    def cut(self, a: int, b: int) -> None:
        """Drop every packet between nodes ``a`` and ``b``, both ways; the root namespace still reaches both."""
        for here, there in ((a, b), (b, a)):
            for address in (self.nodes[there].transport, self.nodes[there].address):
                _in(self.nodes[here].ns, "tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip",
                    "prio", "1", "u32", "match", "ip", "dst", f"{address}/32", "flowid", "1:2")  # fmt: skip
        self.cuts.add(frozenset((a, b)))

    def isolate(self, a: int) -> None:
        """Cut node ``a`` from both others."""
        for other in NODES:
            if other != a:
                self.cut(a, other)

    def heal(self) -> None:
        """Remove every cut."""
        for node in self.nodes.values():
            _in(node.ns, "tc", "filter", "del", "dev", "eth0", "parent", "1:", "prio", "1", check=False)
        self.cuts.clear()

    def reaches(self, a: int, b: int, timeout: float = 1.5) -> bool:
        """Whether a TCP connection from node ``a``'s namespace to ``b``'s transport port opens within ``timeout``."""
        code = (
            "import socket, sys\n"
            "try:\n"
            f"    socket.create_connection(({self.nodes[b].transport!r}, {TRANSPORT_PORT}), timeout={timeout})\n"
            "except OSError:\n"
            "    sys.exit(1)\n"
        )
        return _in(self.nodes[a].ns, sys.executable, "-c", code, check=False, timeout=timeout + 10).returncode == 0

    # --- what the nodes say -----------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes.values()]

    def request(self, path: str, *, node: int | None = None, method: str = "GET", body: Any = None,
                timeout: float = 10.0) -> Any:  # fmt: skip
        """Ask node ``node`` (directly), or the first that answers; return the decoded JSON."""
        bases = [self.nodes[i].direct for i in ([node] if node else NODES)]
        return cluster.first_answer(bases, path, method=method, body=body, timeout=timeout)

    def local_view(self, i: int, timeout: float = 5.0) -> dict[str, Any]:
        """What node ``i`` itself believes (``local=true``, no master needed): its master and the nodes it counts."""
        state = self.request("/_cluster/state/master_node,nodes?local=true", node=i, timeout=timeout)
        names = {node_id: n["name"] for node_id, n in (state.get("nodes") or {}).items()}
        master = state.get("master_node")
        return {"master": names.get(master) if master else None, "nodes": sorted(names.values())}

    def wait_for_nodes(self, count: int, *, status: str | None = None, index: str | None = None,
                       timeout: float = 90.0) -> None:  # fmt: skip
        """Wait until every node sees ``count`` nodes and a master (and ``index`` or all is ``status``)."""
        deadline = time.monotonic() + timeout
        path = f"/_cluster/health/{index or ''}?wait_for_nodes={count}&timeout=5s"
        if status:
            path += f"&wait_for_status={status}"
        last: Any = None
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                assert node.jvm is None or node.jvm.poll() is None, f"{node.name} exited: {self.console(node.number)}"
            try:
                health = self.request(path, timeout=10)
                views = [self.local_view(i) for i in NODES]
                if not health.get("timed_out") and all(v["master"] and len(v["nodes"]) == count for v in views):
                    return
                last = (health, views)
            except AssertionError as e:
                last = e
            time.sleep(0.5)
        raise AssertionError(f"the cluster did not reach {count} nodes {status or ''} within {timeout:g}s: {last}")

    def master(self) -> int:
        (row,) = self.request("/_cat/master?format=json")
        return int(row["node"].removeprefix("n"))

    def shards(self, index: str, node: int | None = None) -> list[dict[str, Any]]:
        return self.request(f"/_cat/shards/{index}?format=json", node=node)

    def routing(self, name: str, node: int, timeout: float = 2.0) -> list[tuple[str, str, str]]:
        """The copies of concrete index ``name``'s shard as node ``node`` last applied them: (node, "p"/"r", state).

        Node ``node``'s own view (``local=true``): no master is asked, no node for statistics (as ``_cat/shards``
        does), so it answers at once while peers are cut off.
        """
        state = self.request(f"/_cluster/state/routing_table,nodes/{name}?local=true", node=node, timeout=timeout)
        names = {node_id: n["name"] for node_id, n in (state.get("nodes") or {}).items()}
        copies = state["routing_table"]["indices"][name]["shards"]["0"]
        return [(names.get(c["node"], "unassigned"), "p" if c["primary"] else "r", c["state"]) for c in copies]

    def primary(self, index: str) -> int:
        for row in self.shards(index):
            if row["prirep"] == "p" and row["state"] == "STARTED":
                return int(row["node"].removeprefix("n"))
        raise AssertionError(f"{index} has no started primary")

    def concrete(self, index: str) -> str:
        """The index an alias names (a lock index is an alias of ``<index>.floor-<N>``)."""
        (name,) = self.request(f"/{index}/_alias")
        return name

    def move_primary_off(self, index: str, node: int, timeout: float = 60.0) -> None:
        """Make a replica on another node the primary of ``index`` (cancel the primary copy on ``node``)."""
        command = {"cancel": {"index": self.concrete(index), "shard": 0, "node": f"n{node}", "allow_primary": True}}
        self.request("/_cluster/reroute", method="POST", body={"commands": [command]})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(AssertionError):
                if self.primary(index) != node:
                    break
            time.sleep(0.2)
        self.wait_for_nodes(3, status="green", index=index, timeout=timeout)
        assert self.primary(index) != node, f"the primary of {index} is still on n{node}"

    def console(self, i: int, lines: int = 30) -> str:
        log = self.nodes[i].dir / "console.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def _ours(pid: str) -> bool:
    """Whether /proc/<pid> is a JVM or proxy of this harness (its command line names :data:`HOME`)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    home = str(HOME).encode()
    return any(
        arg == home or arg.startswith(home + b"/") or (b"=" + home + b"/") in arg for arg in cmdline.split(b"\0")
    )


def remove_stale() -> None:
    """Kill this harness's JVMs and proxies (by pid, found by :data:`HOME` in their command line), delete its
    namespaces, veths and bridge, and its directory."""
    for _ in range(2):
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid() and _ours(p)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    namespaces = run("ip", "netns", "list", check=False).stdout.split("\n")
    for line in namespaces:
        name = line.split(" ", 1)[0]
        if name.startswith(PREFIX) and name[len(PREFIX) :].isdigit():
            run("ip", "netns", "del", name, check=False)
    for entry in json.loads(run("ip", "-j", "link", "show", check=False).stdout or "[]"):
        name = entry.get("ifname", "")
        if name == BRIDGE or (name.startswith(f"{PREFIX}v") and name[len(PREFIX) + 1 :].isdigit()):
            run("ip", "link", "del", name, check=False)
    shutil.rmtree(HOME, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
