"""The wait-for graph under a crowd: built from a read of n waiting requests, and the waiting page over a real store."""

from __future__ import annotations

import dataclasses
import datetime
import random
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.test import RequestFactory, override_settings
from django.urls import reverse

from ..deadlock import WaitForGraph, find_cycle, waiting_requests
from ..modes import Mode
from ..records import HolderRecord, Kind, LockRequest, Node, Owner, WaiterRecord, WaitState
from ..waiting import WaitGraph
from . import quadratic
from .admin import RENDERS, _Viewer
from .common import Figure, ratio_at_most, value_at_most
from .kit import StoreKit

Say = Callable[[str], None]

GROWTH_LIMIT = 15.0
"""Near-linear growth: ten times the waiting requests may cost at most this many times the CPU (n log n: 13x).

The quadratic construction took 100x (and more: it searched once per request).
"""
QUADRATIC_UP_TO = 1_000
"""The quadratic construction is timed up to this size only: at 10,000 it would list some 29 million edges."""
NAMESPACE = "bench-waiting"
_LATER = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)


def crowd_state(size: int, seed: int = 24) -> WaitState:
    """``size`` requests waiting on ``/q`` behind its X holder A, who waits for ``/b``, held by B; B's is the last.

    The crowd asks for random modes, each from an owner of its own (random
    keys, as the stores' are). B queues behind every conflicting one, and
    every one waits for A: one deadlock of them all, the hardest read for
    the graph (a crowd behind a lock that is not deadlocked is easier).
    """
    rng = random.Random(seed)
    q, b = Node("bench", Kind.TREE, "/q"), Node("bench", Kind.TREE, "/b")

    def owner() -> dict[str, Any]:
        return {"key": uuid.UUID(int=rng.getrandbits(128)).hex, "host": "bench", "pid": 1, "thread_name": "t"}

    a_owner, b_owner = owner(), owner()
    holders = (
        HolderRecord(q, Mode.X, "holder-a", a_owner, 1, None, _LATER),
        HolderRecord(b, Mode.X, "holder-b", b_owner, 2, None, _LATER),
    )
    waiters = [WaiterRecord(b, Mode.X, "request-a", a_owner, 0, _LATER)]
    waiters += [
        WaiterRecord(q, rng.choice(list(Mode)), f"request-{i:06d}", owner(), 1 + i, _LATER) for i in range(size - 1)
    ]
    waiters.append(WaiterRecord(q, Mode.X, "request-b", b_owner, size, _LATER))
    return WaitState(tuple(waiters), holders)


def _median_time(operation: Callable[[], Any], rounds: int, clock: Callable[[], float] = time.perf_counter) -> float:
    times = []
    for _ in range(rounds):
        started = clock()
        operation()
        times.append(clock() - started)
    return statistics.median(times)


def graph_figures(sizes: Sequence[int], say: Say) -> list[Figure]:
    """The waiting page's and reap_locks' graph (requests, edges, deadlocks) of ``crowd_state`` at each size.

    Beside the floor of any view of the read: gathering the markers into
    requests. Pure logic, no store: CPU time of this process (wall time in
    ``extra``), so that other processes on the machine do not blur how it
    grows. ``extra`` has one look of the victim (``find_cycle``), the edges
    shown, and up to ``QUADRATIC_UP_TO`` the quadratic construction's edge
    count and one look's time (its edges and one search), as every waiting
    request paid before.
    """
    figures = []
    times: dict[int, float] = {}
    for size in sorted(sizes):
        say(f"wait-for graph of {size:,} waiting requests on one node")
        state = crowd_state(size)
        rounds = 3 if size >= 10_000 else 5
        graph = WaitGraph.of(state)
        cpu = time.process_time
        times[size] = value = _median_time(lambda: WaitGraph.of(state), rounds, cpu)  # noqa: B023 - called at once
        wall = _median_time(lambda: WaitGraph.of(state), rounds)  # noqa: B023
        floor = _median_time(lambda: waiting_requests(state), rounds, cpu)  # noqa: B023
        look = _median_time(lambda: find_cycle(state, "request-b"), rounds, cpu)  # noqa: B023
        extra: dict[str, Any] = {
            "requests": len(graph.requests),
            "edges_shown": len(graph.edges),
            "deadlocks": len(graph.cycles),
            "deadlocked_owners": sum(len(owners) for owners in WaitForGraph(state).deadlocks),
            "victim": graph.cycles[0].victim.holder_id if graph.cycles else None,
            "look_s": look,
            "wall_s": wall,
        }
        note = f"wall {wall * 1000:.1f} ms; one look of the victim (find_cycle) {look * 1000:.1f} ms"
        if size <= QUADRATIC_UP_TO:
            started = time.perf_counter()
            every = quadratic.wait_edges(state)
            try:
                quadratic.find_cycle(state, "request-b")
                old = f"{time.perf_counter() - started:.3f} s"
            except RecursionError:
                old = "RecursionError"
            extra.update(quadratic_edges=len(every), quadratic_look=old)
            note += f"; before: {len(every):,} edges, one look {old}"
        figures.append(
            Figure(
                key=f"graph.n{size}",
                backend="no store",
                label=f"wait-for graph of {size:,} requests waiting on one node (page, reap_locks), CPU",
                value=value,
                unit="s",
                baseline_label="gather markers into requests, CPU",
                baseline=floor,
                goal=value_at_most(1.0, "< 1 s") if size >= 10_000 else None,
                note=note,
                extra=extra,
            )
        )
    ordered = sorted(times)
    if len(ordered) > 1:
        small, large = ordered[-2], ordered[-1]
        figures.append(
            Figure(
                key="graph.growth",
                backend="no store",
                label=f"wait-for graph, {large:,} requests against {small:,}, CPU",
                value=times[large],
                unit="s",
                baseline_label=f"{small:,} requests",
                baseline=times[small],
                goal=ratio_at_most(GROWTH_LIMIT * large / small / 10) if large >= 10 * small else None,
                note=f"{large // small}x the requests",
            )
        )
    return figures


def _owner(name: str) -> Owner:
    return dataclasses.replace(Owner.current(), process=f"bench-{name}-{uuid.uuid4().hex[:8]}", thread_name=name)


def waiting_page(kit: StoreKit, count: int, say: Say) -> list[Figure]:
    """Render the admin's waiting page over ``count`` real requests waiting on one node, against the store's read.

    The requests are sent through the backend (each refused, leaving its
    markers) as ``crowd_state`` lays them out: a crowd behind a holder that
    is deadlocked with the crowd's last request. Needs ``django.contrib.admin``
    and its URLs.
    """
    from django.contrib import admin

    from ..held_lock import HeldLock

    say(f"{kit.name}: admin waiting page over {count:,} waiting requests")
    backend = kit.backend
    marker_ttl = backend.marker_ttl
    backend.marker_ttl = 600.0  # nobody renews these markers while the page is measured
    q, b = Node(NAMESPACE, Kind.TREE, "/q"), Node(NAMESPACE, Kind.TREE, "/b")
    a_owner, b_owner = _owner("a"), _owner("b")
    grants = [
        backend.acquire(LockRequest(f"bench-hold-{n}", o, ((node, Mode.X),), 600.0))
        for n, o, node in (("a", a_owner, q), ("b", b_owner, b))
    ]
    if None in grants:
        raise RuntimeError(f"{NAMESPACE}:/q or /b was held already")
    now = time.time_ns()
    rng = random.Random(24)
    requests = [LockRequest("bench-wait-a", a_owner, ((b, Mode.X),), 600.0, ticket=now, holds_others=True)]
    requests += [
        LockRequest(f"bench-wait-{i:06d}", _owner(f"c{i}"), ((q, rng.choice(list(Mode))),), 600.0, ticket=now + 1 + i)
        for i in range(count - 1)
    ]
    requests.append(LockRequest("bench-wait-b", b_owner, ((q, Mode.X),), 600.0, ticket=now + count, holds_others=True))
    try:
        for request in requests:
            if backend.acquire(request) is not None:
                raise RuntimeError(f"{request.holder_id} was granted: {NAMESPACE}:/q was free")
        model_admin = admin.site._registry[HeldLock]
        with override_settings(LOCK_BACKEND=kit.config):
            from ..conf import get_backend

            page = RequestFactory().get(reverse("admin:django_esdlock_heldlock_waiting"))
            page.user = _Viewer()

            def render() -> Any:
                return model_admin.waiting_view(page).render()

            response = render()  # warm: the page's backend connects
            value = _median_time(render, RENDERS)
            reader = get_backend()
            baseline = _median_time(reader.wait_state, RENDERS)
    finally:
        for request in requests:
            backend.withdraw(request)
        for grant in grants:
            if grant is not None:
                backend.release(grant)
        backend.marker_ttl = marker_ttl
    context = response.context_data
    graph = context["graph"]
    error = context.get("error")
    waiting = len(graph.requests) if graph else 0
    cycles = len(graph.cycles) if graph else 0
    note = error or (
        "" if (waiting, cycles) == (count + 1, 1) else f"read {waiting:,} waiting requests and {cycles} deadlocks"
    )
    return [
        Figure(
            key=f"{kit.name}.admin_waiting",
            backend=kit.name,
            label=f"admin waiting page, {count:,} requests waiting on one node",
            value=value,
            unit="s",
            baseline_label="backend wait_state() read",
            baseline=baseline,
            goal=value_at_most(2.0, "< 2 s") if count >= 1_000 else None,
            note=note,
            extra={
                "waiting": waiting,
                "deadlocks": cycles,
                "rows": len(context["requests"]),
                "more_requests": context["more_requests"],
                "status": response.status_code,
            },
        )
    ]
