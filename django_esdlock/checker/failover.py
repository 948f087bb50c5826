"""The failover fault: SIGKILL the Elasticsearch node of the lock index's primary, or the master; restart it."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

DEFAULT_KILL = "kill -KILL {pid}"
"""SIGKILL of the pid the node reports (``_nodes/process``): right only when the nodes run on this machine."""

ELASTICSEARCH_MAIN = "org.elasticsearch.bootstrap.Elasticsearch"
"""The main class of an Elasticsearch node's JVM: an argument of its own on 7, ``<module>/<class>`` from 8."""

START_CLUSTER_RESTART = "{script} --node {node_number}"
"""The restart of ``../shared/elasticsearch/start-cluster``'s node ``n<i>`` (its kill is :data:`DEFAULT_KILL`)."""

COMMAND_TIMEOUT = 30.0
"""Seconds a kill command may take."""

RESTART_TIMEOUT = 240.0
"""Seconds a restarted node may take to rejoin (JVM start, shard recovery) before the run gives up on it."""


def start_cluster_restart(script: str | os.PathLike[str]) -> str:
    """Return the ``--failover-restart`` template for the start-cluster script at ``script``."""
    return START_CLUSTER_RESTART.format(script=shlex.quote(str(script)), node_number="{node_number}")


@dataclasses.dataclass(frozen=True)
class FailoverCommands:
    """How to kill and restart a node: shell templates with ``{node}``, ``{node_number}``, ``{pid}``, ``{host}``.

    ``{node}`` is the node's name (``n2``), ``{node_number}`` the digits that
    end it (``2``), ``{pid}`` the process id it reports, ``{host}`` the host
    of its HTTP publish address. The restart may block until the node is up:
    it runs in the background while the workload goes on.
    """

    restart: str | None = None
    kill: str = DEFAULT_KILL


class _Node:
    def __init__(self, name: str, info: dict[str, Any]) -> None:
        self.name = name
        self.pid = int(info.get("process", {}).get("id", 0))
        address = str(info.get("http", {}).get("publish_address", info.get("ip", "")))
        self.host = address.rsplit("/", 1)[-1].rsplit(":", 1)[0].strip("[]") or str(info.get("host", ""))
        digits = re.search(r"(\d+)$", name)
        self.number = digits.group(1) if digits else ""

    def fields(self) -> dict[str, Any]:
        return {"node": self.name, "node_number": self.number, "pid": self.pid, "host": self.host}


def shell_command(template: str, node: _Node) -> str:
    """Return ``template`` with the node's placeholders filled in, each quoted for the shell.

    Names and addresses come from the cluster's answer: quoted, a node named
    ``n1; rm -rf ~`` is one argument, not a second command. Write the
    placeholders bare (``ssh {host} ...``), not in quotes of your own.
    """
    return template.format(**{name: shlex.quote(str(value)) for name, value in node.fields().items()})


def elasticsearch_jvm(pid: int, proc: str = "/proc") -> bool:
    """Whether ``/proc/<pid>/cmdline`` is an Elasticsearch node's JVM (its main class among the arguments)."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            arguments = f.read().split(b"\0")
    except OSError:
        return False
    main = ELASTICSEARCH_MAIN.encode()
    return any(a == main or a.endswith(b"/" + main) for a in arguments)


def refuse_to_kill(pid: int, *, local: bool = True) -> str:
    """Return why ``pid`` must not be killed, or "" if it may be.

    Never pid 0 or below (a signal to 0 reaches this process group, to -1
    every process we may signal), never 1, never this process or the leader
    of its group. On this machine (``local``) only an Elasticsearch JVM, as
    its ``/proc/<pid>/cmdline`` shows: a node may report a pid that is now
    another process's, or one of another pid namespace.
    """
    if pid <= 1:
        return f"pid {pid} is not a process of its own (0 and below signal groups; 1 is init)"
    if pid in (os.getpid(), os.getpgrp()):
        return f"pid {pid} is lock_check itself or the leader of its process group"
    if local and not elasticsearch_jvm(pid):
        return f"/proc/{pid}/cmdline is not an Elasticsearch JVM (no {ELASTICSEARCH_MAIN} among its arguments)"
    return ""


def why_not_kill(node: _Node, template: str = DEFAULT_KILL) -> str:
    """Return why ``template`` must not kill ``node``, or "" if it may.

    The pid is judged by :func:`refuse_to_kill`: fully for the default kill
    and for a command that uses ``{pid}`` on a node of this machine; a
    command for another machine only has its pid checked for sanity, and
    one without ``{pid}`` is the command's own business.
    """
    if template != DEFAULT_KILL and "{pid}" not in template:
        return ""
    return refuse_to_kill(node.pid, local=template == DEFAULT_KILL or _local(node.host))


def kill(node: _Node, template: str = DEFAULT_KILL) -> None:
    """Kill ``node`` with ``template`` (:data:`DEFAULT_KILL`: SIGKILL from here); RuntimeError if it must not."""
    why = why_not_kill(node, template)
    if why:
        raise RuntimeError(f"not killing node {node.name}: {why}")
    if template == DEFAULT_KILL:
        os.kill(node.pid, signal.SIGKILL)
    else:
        subprocess.run(shell_command(template, node), shell=True, check=True, timeout=COMMAND_TIMEOUT)


def failover_errors() -> tuple[type[BaseException], ...]:
    """What a failover may raise: the cluster's answers and failures, a kill command's."""
    import elasticsearch

    return (elasticsearch.ApiError, elasticsearch.TransportError, OSError, subprocess.SubprocessError, RuntimeError,
            KeyError, ValueError)  # fmt: skip


def _local(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host in ("localhost", socket.gethostname())
    if address.is_loopback:
        return True
    with contextlib.suppress(OSError):
        return host in {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    return False


class Failover:
    """Kills the lock index's primary node or the master, in turn, and restarts it in the background.

    One node is down at a time: the next kill waits until the cluster has all
    its nodes again. :meth:`settle` waits for the last restart.
    """

    def __init__(self, backend: Any, index: str, commands: FailoverCommands, record: Callable[..., Any]) -> None:
        self.client = backend.client.options(request_timeout=10, max_retries=len(backend.hosts) + 1)
        self.index = index
        self.commands = commands
        self.record = record
        self.node_count = 0
        self.kills = 0
        self.restarting: tuple[_Node, subprocess.Popen[bytes]] | None = None
        self.unrestarted: _Node | None = None
        self.settled = False
        self._output: Any = None

    # --- what the cluster says ---------------------------------------------------

    def nodes(self) -> dict[str, _Node]:
        answer = self.client.nodes.info(metric="process,http").body
        return {info["name"]: _Node(info["name"], info) for info in answer["nodes"].values()}

    def applicable(self) -> str:
        """Return why the fault cannot apply to this cluster, or "" if it can."""
        nodes = self.nodes()
        self.node_count = len(nodes)
        if len(nodes) < 2:
            return "a single Elasticsearch node: killing it stops the store instead of failing it over"
        if not self.commands.restart:
            return "no --failover-restart command: a killed node could not be started again"
        if self.commands.kill == DEFAULT_KILL and not all(_local(n.host) for n in nodes.values()):
            return "the nodes are not on this machine: give --failover-kill"
        # A fresh lock index's replicas start after it: kill its primary before and the index is lost, not failed over.
        # (A timeout is no reason to skip: each failover waits for a whole cluster anyway.)
        self.client.options(ignore_status=408, request_timeout=40).cluster.health(
            index=self.index, wait_for_no_initializing_shards=True, wait_for_no_relocating_shards=True, timeout="30s"
        )
        return ""

    def primary(self) -> str:
        for row in self.client.cat.shards(index=self.index, format="json").body:
            if row.get("prirep") == "p" and row.get("state") == "STARTED":
                return str(row["node"])
        raise RuntimeError(f"{self.index} has no started primary")

    def master(self) -> str:
        (row,) = self.client.cat.master(format="json").body
        return str(row["node"])

    def whole(self) -> bool:
        """Whether every node is back and the lock index has a copy on each it had."""
        with contextlib.suppress(Exception):
            health = self.client.cluster.health(
                index=self.index,
                wait_for_nodes=str(self.node_count),
                wait_for_no_initializing_shards=True,
                timeout="1s",
            ).body
            return not health.get("timed_out") and health.get("status") != "red"
        return False

    # --- the fault -----------------------------------------------------------------

    def inject(self) -> bool:
        """Kill the primary's node (odd turns: the master) and start its restart; False if the last is not back yet."""
        if not self.ready():
            return False
        role = "primary" if self.kills % 2 == 0 else "master"
        name = self.primary() if role == "primary" else self.master()
        node = self.nodes()[name]
        why = why_not_kill(node, self.commands.kill)
        if why:  # refused before anything was done: nothing to restart
            raise RuntimeError(f"not killing node {name}: {why}")
        self.kills += 1
        self.unrestarted = node
        kill(node, self.commands.kill)
        self.record("node_kill", node=name, role=role, pid=node.pid, index=self.index)
        self._restart()
        return True

    def ready(self) -> bool:
        """Whether the last killed node was restarted and the cluster is whole again."""
        if self.restarting is not None:
            node, process = self.restarting
            if process.poll() is None:
                return False
            self.restarting = None
            output = self._read_output()
            if process.returncode:
                self.record("node_restarted", node=node.name, exitcode=process.returncode, output=output[-1000:])
            else:
                self.record("node_restarted", node=node.name, exitcode=0)
        return self.whole()

    def _restart(self) -> None:
        node, self.unrestarted = self.unrestarted, None
        if node is None:
            return
        command = shell_command(self.commands.restart, node)  # type: ignore[arg-type]
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 - read and closed when the restart ends
        process = subprocess.Popen(
            command, shell=True, stdin=subprocess.DEVNULL, stdout=self._output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.restarting = (node, process)
        self.record("node_restart", node=node.name, command=command)

    def _read_output(self) -> str:
        output, self._output = self._output, None
        if output is None:
            return ""
        with output:
            output.seek(0)
            return output.read().decode(errors="replace")

    def settle(self, timeout: float = RESTART_TIMEOUT) -> None:
        """Restart a node killed but not restarted, wait for the restart and the whole cluster; record the outcome."""
        if self.settled:
            return
        self.settled = True
        self._restart()
        deadline = time.monotonic() + timeout
        while not self.ready() and time.monotonic() < deadline:
            time.sleep(0.5)
        if self.restarting is not None:  # the restart command outlived the timeout: end it
            node, process = self.restarting
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            self.restarting = None
            self.record("node_not_back", node=node.name, seconds=timeout, output=self._read_output()[-1000:])
        elif self.kills:
            self.record("cluster_whole" if self.whole() else "cluster_not_whole", nodes=self.node_count)
