"""One benchmark run: every store in turn, every figure, errors kept per stage so the rest still runs."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings

from ..conf import DEFAULT_DEADLOCK_TIMEOUT
from ..noida import elasticsearch_url
from ..redaction import redact, redact_data
from . import async_tasks, fencing, observed, scenarios
from .admin import changelist
from .common import Figure
from .graph import graph_figures, waiting_page
from .kit import StoreKit
from .peers import redis_lock, tooz_postgres
from .stores import elasticsearch_store, postgres_store, sqlite_store
from .workers import WorkerPool

STORES = ("elasticsearch", "postgres")
"""The stores of ``--backend all``: the production targets."""
OTHER_STORES = ("sqlite",)
"""Stores measured only when named: SQLite, the zero-setup embedded default."""
STAGES = (
    "graph",
    "pairs",
    "requests",
    "wakeup",
    "contention",
    "global",
    "semaphore",
    "writer_wait",
    "deadlock",
    "reap",
    "admin",
    "admin_waiting",
    "async_pairs",
    "async_wakeup",
    "fencing",
    "observability",
)
"""The figures' stages, in the order they run: ``graph`` once (no store), the others on each store."""
POOL_STAGES = frozenset({"wakeup", "contention", "global", "semaphore", "writer_wait", "deadlock", "async_wakeup"})
"""The stages that need worker processes."""


@dataclasses.dataclass(frozen=True)
class Options:
    """What to measure and how long; see ``manage.py lock_bench --help``."""

    stores: tuple[str, ...] = STORES
    seconds: float = 3.0
    workers: int = 8
    depths: tuple[int, ...] = (1, 4, 16)
    wake_rounds: int = 200
    request_rounds: int = 20
    reap_count: int = 10_000
    admin_count: int = 100_000
    waiting_count: int = 1_000
    """Requests waiting on one node in the admin waiting page figure."""
    graph_sizes: tuple[int, ...] = (100, 1_000, 10_000)
    """Waiting requests on one node in the wait-for graph figures (no store)."""
    only: tuple[str, ...] = STAGES
    """The stages to run (``--only``)."""
    es_url: str | None = None
    database_url: str | None = None
    peers: bool = False
    """Also measure the peer locks of ``bench.peers`` (PostgreSQL runs only)."""
    tasks: int = 100
    """Tasks of one process in the async many-task figure."""
    deadlock_rounds: int = 20
    deadlock_timeout: float = DEFAULT_DEADLOCK_TIMEOUT
    """The workers' deadlock timeout in the deadlock detection figure (the setting's default)."""

    @property
    def churners(self) -> int:
        """Processes below ``/a`` in the writer-wait figure: at least 4."""
        return max(4, self.workers // 2)


@dataclasses.dataclass
class Report:
    """The figures of a run, the stages that failed, and facts about the stores that help read them."""

    options: Options
    figures: list[Figure] = dataclasses.field(default_factory=list)
    errors: list[dict[str, str]] = dataclasses.field(default_factory=list)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data, redacted (its URLs may carry credentials)."""
        return redact_data(
            {
                "options": dataclasses.asdict(self.options),
                "facts": self.facts,
                "figures": [f.as_dict() for f in self.figures],
                "errors": self.errors,
            }
        )


@contextlib.contextmanager
def _kit(store: str, options: Options) -> Iterator[StoreKit]:
    """Yield the kit of ``store`` on a throwaway index or database, removed afterwards."""
    if store == "elasticsearch":
        from .elasticsearch import ElasticsearchKit

        with elasticsearch_url(options.es_url) as url, elasticsearch_store(url) as config:
            kit: StoreKit = ElasticsearchKit(config)
            try:
                yield kit
            finally:
                kit.close()
    elif store == "sqlite":
        from .sqlite import SqliteKit

        with sqlite_store() as config:
            kit = SqliteKit(config)
            try:
                yield kit
            finally:
                kit.close()
    else:
        from .postgres import PostgresKit

        with postgres_store(options.database_url) as config:
            kit = PostgresKit(config)
            try:
                yield kit
            finally:
                kit.close()


def _stages(
    kit: StoreKit, pool: WorkerPool | None, o: Options, facts: dict[str, Any], say: Callable[[str], None]
) -> dict[str, Callable[[], Any]]:
    peers = []
    if o.peers and kit.name == "postgres":
        peers = [tooz_postgres(kit.config["OPTIONS"]["url"]), redis_lock()]
    return {
        "pairs": lambda: scenarios.pairs(kit, o.depths, o.seconds, say),
        "requests": lambda: scenarios.requests(kit, o.depths, o.request_rounds, say),
        "wakeup": lambda: scenarios.wakeup(kit, pool, o.wake_rounds, facts.get("wake_floor"), say),
        "contention": lambda: scenarios.contention(kit, pool, o.workers, o.seconds, say),
        "global": lambda: scenarios.global_locks(kit, pool, o.workers, o.seconds, peers, say),
        "semaphore": lambda: scenarios.semaphores(kit, pool, o.workers, o.seconds, say),
        "writer_wait": lambda: scenarios.writer_wait(kit, pool, o.churners, o.seconds, say),
        "deadlock": lambda: scenarios.deadlock_latency(kit, pool, o.deadlock_rounds, o.deadlock_timeout, say),
        "reap": lambda: scenarios.reaping(kit, o.reap_count, say),
        "admin": lambda: changelist(kit, o.admin_count, say),
        "admin_waiting": lambda: waiting_page(kit, o.waiting_count, say),
        "async_pairs": lambda: async_tasks.pairs(kit, o.tasks, o.seconds, say),
        "async_wakeup": lambda: async_tasks.wakeup(kit, pool, o.wake_rounds, say),
        "fencing": lambda: fencing.figures(kit, o.seconds, say),
        "observability": lambda: observed.figures(kit, o.seconds, say),
    }


def run(options: Options, say: Callable[[str], None] = lambda message: None) -> Report:
    """Measure every figure on every store of ``options``; a failing stage is recorded, not raised."""
    settings_module = getattr(settings, "SETTINGS_MODULE", None) or os.environ.get("DJANGO_SETTINGS_MODULE")
    if not settings_module:
        raise RuntimeError("lock_bench starts worker processes, which need DJANGO_SETTINGS_MODULE")
    # The load average says whether something else shared the machine with the run.
    report = Report(
        options,
        facts={"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_before": os.getloadavg()},
    )
    pool = None
    with contextlib.ExitStack() as stores:
        try:
            if "graph" in options.only:
                try:
                    report.figures += graph_figures(options.graph_sizes, say)
                except Exception as e:  # noqa: BLE001 - as a stage: the stores' figures still run
                    report.errors.append({"store": "no store", "stage": "graph", "error": _describe(e)})
                    say(f"graph failed: {e}")
            if not set(options.only) - {"graph"}:
                return report
            # Every store set up before the worker processes start: a store that cannot be reached fails in
            # the time its setup takes, and costs no pool.
            kits = {}
            for store in options.stores:
                try:
                    kits[store] = stores.enter_context(_kit(store, options))
                except Exception as e:  # noqa: BLE001 - the store could not be set up: the other may still run
                    report.errors.append({"store": store, "stage": "setup", "error": _describe(e)})
                    say(redact(f"{store}: setup failed: {e}"))
            if kits and POOL_STAGES.intersection(options.only):
                say(f"starting {max(options.workers, options.churners)} worker processes")
                pool = WorkerPool(max(options.workers, options.churners), settings_module)
                report.facts["wake_floor"] = pool.wake_floor(rounds=max(10, options.wake_rounds // 2))
            for store, kit in kits.items():
                report.facts[store] = kit.facts()
                try:
                    for stage, measure in _stages(kit, pool, options, report.facts, say).items():
                        if stage not in options.only:
                            continue
                        try:
                            report.figures += measure()
                        except Exception as e:  # noqa: BLE001 - one broken figure must not hide the others
                            report.errors.append({"store": store, "stage": stage, "error": _describe(e)})
                            say(redact(f"{store}: {stage} failed: {e}"))
                finally:
                    if pool is not None:
                        pool.forget(kit.config)
        finally:
            if pool is not None:
                pool.close()
            report.facts["loadavg_after"] = os.getloadavg()
    return report


def _describe(error: BaseException) -> str:
    """The error and the line that raised it: enough to start looking, short enough for a table."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return redact(f"{type(error).__name__}: {error}{where}")


def dashboard(options: Options, path: str, seconds: float, say: Callable[[str], None] = lambda message: None) -> None:
    """Fill the dashboard's panels with a workload of ``seconds`` on the first store of ``options``; draw them."""
    from . import dashboard as panels

    with _kit(options.stores[0], options) as kit:
        panels.draw(panels.record(kit, seconds, say), path)
