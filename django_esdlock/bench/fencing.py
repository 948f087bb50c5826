"""What fencing costs a write: ``fenced_update`` against a plain ``QuerySet.update`` of the same rows, same run.

The rows live in the run's throwaway database (a table made here, dropped
after), reached through a Django alias of its own; the model is kept out of
the project's app registry (its own ``Apps``), so no migration ever sees it.
Both writes run in autocommit, as a view's would: the fenced one is the same
single ``UPDATE`` with a ``CASE`` on the fence, so its goal is to cost at
most about 10 % more (``≥ 0.91x`` the plain rate).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import environ
from django.apps.registry import Apps
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.models import F
from django.db.utils import ConnectionHandler

from ..fencing import FenceField, fenced_update
from ..locks import lock_tree
from .common import Figure, interleaved_rates, ratio_at_least
from .kit import StoreKit

Say = Callable[[str], None]

ALIAS = "esdlock_bench_fencing"
ROW_COUNTS = (1, 100)
"""Rows each measured update writes: one row by primary key, and a batch."""
GOAL = ratio_at_least(0.91)
"""Fenced writes/s at least 0.91x the plain ones: the fence costs at most ~10 % (the goal on PostgreSQL)."""

_apps = Apps()


class BenchRow(models.Model):
    value = models.BigIntegerField(default=0)
    fence = FenceField()

    class Meta:
        apps = _apps
        app_label = "esdlock_bench"
        db_table = "esdlock_bench_fenced"

    def __str__(self) -> str:
        return str(self.pk)


@contextlib.contextmanager
def _rows_database(url: str, count: int) -> Iterator[str]:
    """Yield a Django alias on the database at ``url`` holding ``count`` rows of :class:`BenchRow`; clean up after."""
    settings = ConnectionHandler({DEFAULT_DB_ALIAS: {}, ALIAS: environ.Env.db_url_config(url)}).settings[ALIAS]
    connections.settings[ALIAS] = settings
    try:
        connection = connections[ALIAS]
        with connection.schema_editor() as editor:
            editor.create_model(BenchRow)
        try:
            BenchRow.objects.using(ALIAS).bulk_create(BenchRow() for _ in range(count))
            yield ALIAS
        finally:
            with connection.schema_editor() as editor:
                editor.delete_model(BenchRow)
            connection.close()
    finally:
        with contextlib.suppress(AttributeError):
            del connections[ALIAS]
        del connections.settings[ALIAS]


def figures(kit: StoreKit, seconds: float, say: Say) -> list[Figure]:
    """fenced_update writes/s against QuerySet.update writes/s, by rows per write; none on Elasticsearch."""
    if kit.name not in ("postgres", "sqlite"):
        return []
    found = []
    with _rows_database(kit.config["OPTIONS"]["url"], max(ROW_COUNTS)) as alias:
        first = BenchRow.objects.using(alias).order_by("pk").values_list("pk", flat=True)
        ids = list(first)
        with lock_tree("/fenced", namespace="bench", backend=kit.backend) as lock:
            for count in ROW_COUNTS:
                say(f"{kit.name}: fenced_update against update, {count} row(s)")
                rows = BenchRow.objects.using(alias).filter(pk__in=ids[:count]) if count > 1 else None
                if rows is None:
                    rows = BenchRow.objects.using(alias).filter(pk=ids[0])

                def plain(rows: Any = rows) -> None:
                    rows.update(value=F("value") + 1)

                def fenced(rows: Any = rows) -> None:
                    fenced_update(rows, lock, value=F("value") + 1)

                rates = interleaved_rates({"fenced": fenced, "plain": plain}, seconds)
                found.append(
                    Figure(
                        key=f"{kit.name}.fencing.rows{count}",
                        backend=kit.name,
                        label=f"fenced_update writes/s, {count} row(s)",
                        value=rates["fenced"].per_second,
                        unit="/s",
                        baseline_label="QuerySet.update",
                        baseline=rates["plain"].per_second,
                        goal=GOAL if kit.name == "postgres" else None,
                        extra={
                            "median_fenced_s": rates["fenced"].median,
                            "median_plain_s": rates["plain"].median,
                        },
                    )
                )
    return found
