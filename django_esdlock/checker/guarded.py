"""lock_check's guarded data: a list per exclusive lock node, to which each holder appends its operation id.

Elle's list-append, on the user's own data store: the lock database (a table
of the run's own, created and dropped by the run) or the Elasticsearch
cluster (an index of the run's own). Each grant of a node in X reads the
node's list and writes it back with its operation id appended, through the
fencing helpers: :func:`~django_esdlock.fencing.fenced_update` on the rows,
:func:`~django_esdlock.fencing.fenced_update_document` on the documents,
each also conditional on the list it read (a compare-and-set: a late writer
may slip in between a new holder's read and its first write, before any
newer fence is there to stop it). A holder told of its loss makes one more
append with its bare token and the list it read first, fenced but not
compared, as a holder that did not look would write: the fence alone must
refuse it once a newer holder wrote. Mode ``plain`` is the control: the
same appends as plain updates, no fence, no compare; the checker must catch
what it loses.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

MODES = ("fenced", "plain")
"""``fenced``: the fencing helpers and a compare-and-set; ``plain``: unconditional updates (the control run)."""

ALIAS_PREFIX = "esdlock_lock_check_"
"""The Django database alias each run registers for its guarded table (the prefix of; one per run: two runs of one
process may be on two databases)."""

OK, STALE, CHANGED, LOST, ERROR = "ok", "stale", "changed", "lost", "error"
"""How an append ended: written; refused by a newer fence; refused, the list having changed since it was read;
not sent, the lock being lost (its ``check()``); failed otherwise (indeterminate)."""


def data_key(node: list[str]) -> str:
    """The record of a lock node ``[namespace, kind, key, mode]``: one per node, whatever its namespace."""
    return f"{node[1]}:{node[2]}"


@dataclasses.dataclass(frozen=True)
class GuardedStore:
    """Where the run's guarded data lives (picklable: it crosses the spawn to the workers)."""

    kind: str
    """``database`` or ``elasticsearch``."""
    name: str
    """The table or index."""
    mode: str
    settings: dict[str, Any] | None = None
    """The lock database's Django settings (a database store)."""
    client_options: dict[str, Any] | None = None
    """The Elasticsearch client's options (an Elasticsearch store)."""

    @classmethod
    def for_backend(cls, backend: Any, mode: str) -> GuardedStore:
        if mode not in MODES:
            raise ValueError(f"guarded data mode {mode!r}: one of {', '.join(MODES)}")
        suffix = uuid.uuid4().hex[:10]
        if hasattr(backend, "client_options"):
            options = {**backend.client_options, "hosts": list(backend.hosts)}
            return cls("elasticsearch", f"lock-check-data-{suffix}", mode, client_options=options)
        return cls("database", f"esdlock_check_{suffix}", mode, settings=dict(backend._base_settings()))

    def open(self) -> Any:
        return _Rows(self) if self.kind == "database" else _Documents(self)


class _Rows:
    """The guarded table, through a model made for it (unmanaged: the run creates and drops the table)."""

    def __init__(self, store: GuardedStore) -> None:
        from django.db import connections, models

        from ..fencing import FenceField

        self.alias = ALIAS_PREFIX + store.name
        if self.alias not in connections.settings:
            connections.settings[self.alias] = {**store.settings, "ATOMIC_REQUESTS": False, "AUTOCOMMIT": True}
        self.store = store
        meta = type("Meta", (), {"db_table": store.name, "app_label": "django_esdlock", "managed": False})
        attrs = {
            "__module__": __name__,
            "Meta": meta,
            "key": models.CharField(max_length=255, primary_key=True),
            "ops": models.TextField(default="[]"),
            "fence": FenceField(),
        }
        self.model: Any = type(f"GuardedRecord_{store.name}", (models.Model,), attrs)
        self.rows = self.model.objects.using(self.alias)

    def create(self, keys: list[str]) -> None:
        from django.db import connections

        with connections[self.alias].schema_editor() as editor:
            editor.create_model(self.model)
        self.rows.bulk_create([self.model(key=key) for key in keys])

    def drop(self) -> None:
        from django.db import connections

        try:
            with connections[self.alias].schema_editor() as editor:
                editor.delete_model(self.model)
        finally:
            self.close()
            connections.settings.pop(self.alias, None)

    def read(self, key: str) -> list[str]:
        return json.loads(self.rows.get(key=key).ops)

    def all(self) -> dict[str, list[str]]:
        return {row.key: json.loads(row.ops) for row in self.rows.all()}

    def append(self, key: str, seen: list[str], item: str, lock_or_token: Any, compare: bool = True) -> str:
        """Write ``seen`` + ``item``: fenced, and with ``compare`` only if the list is still ``seen``."""
        from ..exceptions import LockLost, StaleFence
        from ..fencing import fenced_update

        written = json.dumps([*seen, item])
        if self.store.mode == "plain":
            self.rows.filter(key=key).update(ops=written)
            return OK
        rows = self.rows.filter(key=key, ops=json.dumps(seen)) if compare else self.rows.filter(key=key)
        try:
            matched = fenced_update(rows, lock_or_token, ops=written)
        except StaleFence:
            return STALE
        except LockLost:
            return LOST
        return OK if matched else CHANGED

    def close(self) -> None:
        from django.db import connections

        connections[self.alias].close()


class _Documents:
    """The guarded index: one document per record, ``ops`` its list, ``fence`` the newest token that wrote it."""

    def __init__(self, store: GuardedStore) -> None:
        import elasticsearch

        self.store = store
        self.client = elasticsearch.Elasticsearch(**store.client_options)

    def create(self, keys: list[str]) -> None:
        self.client.indices.create(index=self.store.name, settings={"number_of_shards": 1})
        operations: list[dict[str, Any]] = []
        for key in keys:
            operations += [{"create": {"_index": self.store.name, "_id": key}}, {"ops": [], "fence": 0}]
        self.client.bulk(operations=operations, refresh=True)

    def drop(self) -> None:
        self.client.options(ignore_status=404).indices.delete(index=self.store.name)
        self.client.close()

    def read(self, key: str) -> list[str]:
        return list(self.client.get(index=self.store.name, id=key)["_source"]["ops"])

    def all(self) -> dict[str, list[str]]:
        self.client.indices.refresh(index=self.store.name)
        hits = self.client.search(index=self.store.name, size=10_000, query={"match_all": {}})["hits"]["hits"]
        return {hit["_id"]: list(hit["_source"]["ops"]) for hit in hits}

    def append(self, key: str, seen: list[str], item: str, lock_or_token: Any, compare: bool = True) -> str:
        """Write ``seen`` + ``item``: fenced, and with ``compare`` only if the list is still ``seen``."""
        from ..exceptions import LockLost, StaleFence
        from ..fencing import fenced_update_document

        written = [*seen, item]
        if self.store.mode == "plain":
            self.client.update(index=self.store.name, id=key, doc={"ops": written})
            return OK
        expect = {"ops": seen} if compare else None
        try:
            outcome = fenced_update_document(
                self.client, self.store.name, key, {"ops": written}, lock_or_token, expect=expect
            )
        except StaleFence:
            return STALE
        except LockLost:
            return LOST
        return OK if outcome == "updated" else CHANGED

    def close(self) -> None:
        self.client.close()
