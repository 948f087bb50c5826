"""The lock index: its mapping and settings, its setup as an alias of one incarnation, upgrades and system checks.

Each lock index is an alias of one concrete index, ``<index>.floor-<floor>``,
whose tokens all exceed its floor; a lost one is recreated above every token
this process saw. What a ``_bulk`` answer from the wrong incarnation means is
decided here too (:meth:`IndexSetup._misplaced`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from django.core import checks

from ... import modes, paths
from ...exceptions import LockBackendUnavailable
from ...records import Grant, Kind, LockRequest, Node, Owner
from ...steps import Steps, drive
from ..base import renew_params
from . import answers, scripts
from .options import NESTED_OBJECTS_LIMIT, incarnation, token_floor_of
from .transport import INCARNATION_TRIES, StoreCall, body_of, error_type

MAPPING_VERSION = 5

logger = logging.getLogger("django_esdlock")

ALREADY_EXISTS = "resource_already_exists_exception"
NOT_FOUND = "index_not_found_exception"
TAKEN_BY_OTHERS = frozenset({ALREADY_EXISTS, "illegal_state_exception", "invalid_alias_name_exception", NOT_FOUND})
"""What index creation and alias swaps answer when another process changed the lock index first."""

_OWNER = {
    "properties": {
        "host": {"type": "keyword"},
        "pid": {"type": "long"},
        "thread": {"type": "keyword"},
        "thread_name": {"type": "keyword"},
        "process": {"type": "keyword"},
        "started": {"type": "keyword"},
        "pidns": {"type": "keyword"},
        "key": {"type": "keyword"},
    }
}

MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "_meta": {"django_esdlock": {"mapping_version": MAPPING_VERSION}},
    "properties": {
        "namespace": {"type": "keyword"},
        "kind": {"type": "keyword"},
        "key": {"type": "keyword"},
        "parent": {"type": "keyword"},
        "depth": {"type": "integer"},
        # The chapter's views, kept in step with `holders` by every script.
        "lock_type": {"type": "keyword"},
        "lock_count": {"type": "integer"},
        "modes": {"type": "keyword"},
        "holders": {
            "type": "nested",
            "properties": {
                "id": {"type": "keyword"},
                "mode": {"type": "keyword"},
                "token": {"type": "long"},
                "owner": _OWNER,
                "acquired_at": {"type": "date", "format": "epoch_millis"},
                "expires_at": {"type": "date", "format": "epoch_millis"},
                # Intent and checkpoint are kept on the holder's main node (its S or X node) alone;
                # `has_intent` marks the holder on every node, so that, expired, it still blocks there.
                "intent": {"type": "object", "enabled": False},
                "checkpoint": {"type": "object", "enabled": False},
                "recovery": {"type": "object", "enabled": False},
                "has_intent": {"type": "boolean"},
                # On an ancestor (IS/IX): the id of the holder's main node, where it shows whether it still holds,
                # and which write of the entry this is (a holder's every write has its own: see "Ancestors").
                "main": {"type": "keyword", "index": False, "doc_values": False},
                "write": {"type": "long", "index": False, "doc_values": False},
            },
        },
        # Markers of requests that waited (fair waiting); read by scripts only.
        "waiters": {"type": "object", "enabled": False},
        # When the latest marker written here expires: finds the nodes with waiters (deadlock detection).
        "waiting_until": {"type": "date", "format": "epoch_millis"},
        # A semaphore's: the limit its holders were granted under (it stands while any holds).
        "holder_limit": {"type": "integer"},
    },
}

ADDED_SINCE_VERSION_1 = ("waiting_until",)
"""Fields a lock index of mapping version 1 lacks; setup adds them (adding a field is allowed on a live index)."""
ADDED_SINCE_VERSION_2 = ("holders.has_intent", "holders.owner.pidns")
"""Fields a lock index of mapping version 2 lacks (setup adds them too)."""
ADDED_SINCE_VERSION_3 = ("holder_limit",)
"""Fields a lock index of mapping version 3 lacks (setup adds them too)."""
ADDED_SINCE_VERSION_4 = ("holders.main", "holders.write")
"""Fields a lock index of mapping version 4 lacks (setup adds them too)."""
UPGRADE_PROPERTIES: dict[str, Any] = {
    "waiting_until": MAPPING["properties"]["waiting_until"],
    "holder_limit": MAPPING["properties"]["holder_limit"],
    "holders": {
        "type": "nested",
        "properties": {
            "has_intent": MAPPING["properties"]["holders"]["properties"]["has_intent"],
            "main": MAPPING["properties"]["holders"]["properties"]["main"],
            "write": MAPPING["properties"]["holders"]["properties"]["write"],
            "owner": {"properties": {"pidns": _OWNER["properties"]["pidns"]}},
        },
    },
}
"""What setup puts into the mapping of an existing lock index: every field added since version 1 (a no-op when
the index has them)."""
PROPERTIES_OF_VERSION_4: dict[str, Any] = {
    **MAPPING["properties"],
    "holders": {
        **MAPPING["properties"]["holders"],
        "properties": {
            k: v for k, v in MAPPING["properties"]["holders"]["properties"].items() if k not in ("main", "write")
        },
    },
}
PROPERTIES_OF_VERSION_3 = {k: v for k, v in PROPERTIES_OF_VERSION_4.items() if k not in ADDED_SINCE_VERSION_3}
PROPERTIES_OF_VERSION_2: dict[str, Any] = {
    **PROPERTIES_OF_VERSION_3,
    "holders": {
        **PROPERTIES_OF_VERSION_3["holders"],
        "properties": {
            **{k: v for k, v in PROPERTIES_OF_VERSION_3["holders"]["properties"].items() if k != "has_intent"},
            "owner": {"properties": {k: v for k, v in _OWNER["properties"].items() if k != "pidns"}},
        },
    },
}
PROPERTIES_OF_VERSION_1 = {k: v for k, v in PROPERTIES_OF_VERSION_2.items() if k not in ADDED_SINCE_VERSION_1}

# One primary shard: every write of a request lands on one shard, in order, and
# its `_seq_no` (with the primary term, our fencing token) is one sequence for the whole lock index.
INDEX_SETTINGS: dict[str, Any] = {"number_of_shards": 1}


def copies_of(replicas: int | str, data_nodes: int) -> int:
    """Return how many copies of a lock index ``replicas`` keeps on a cluster of ``data_nodes`` data nodes."""
    if isinstance(replicas, int):
        return 1 + replicas
    low, high = replicas.split("-")
    most = data_nodes - 1 if high == "all" else int(high)
    return 1 + max(int(low), min(most, data_nodes - 1))


_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def byte_size(value: Any) -> int | None:
    """Return an Elasticsearch byte size setting (``100mb``, ``1gb``, ``512``) in bytes; None if unreadable."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)b?", str(value).strip().lower())
    if match is None:
        return None
    return int(float(match.group(1)) * _BYTE_UNITS[match.group(2)])


def is_lock_mapping(mappings: Mapping[str, Any]) -> bool:
    """Return whether ``mappings`` are django-esdlock's (of any version): its ``_meta`` says so."""
    return "django_esdlock" in (mappings.get("_meta") or {})


def auto_created(mappings: Mapping[str, Any]) -> bool:
    """Return whether ``mappings`` are those of an index a lock write created by itself (dynamic, lock fields)."""
    dynamic = mappings.get("dynamic", True) in (True, "true")
    return dynamic and set(mappings.get("properties") or {}) <= set(MAPPING["properties"])


def add_alias(index: str, alias: str) -> dict[str, Any]:
    """The alias action that makes ``index`` the one index ``alias`` writes to (refused if another one is)."""
    return {"add": {"index": index, "alias": alias, "is_write_index": True}}


class IndexSetup:
    """The lock indices of an :class:`~django_esdlock.backends.elasticsearch.ElasticsearchLockBackend`.

    A mixin of the backend: it creates, adopts, replaces and upgrades the
    lock indices (through :class:`~.transport.Transport`'s store calls),
    keeps which incarnation each one is, and checks them (``check --deploy``).
    """

    def _init_index(self) -> None:
        self._active_shards: int | str | None = None
        """``wait_for_active_shards`` as sent: resolved from "auto" when the lock indices are set up."""
        self._index_ready = False
        self._per_item_alias: bool | None = None
        """Whether ``_bulk`` action lines may say ``require_alias`` (Elasticsearch 7.10 and later)."""
        self._current: dict[str, str] = {}
        """lock index (an alias) -> the concrete index this process writes to through it (itself, if legacy)."""
        self._current_high: dict[str, int] = {}
        """lock index -> the highest token position this process saw written in its current concrete index."""
        self._past_high: dict[str, int] = {}
        """lock index -> the highest token position this process saw written in its earlier concrete indices."""

    def _index_settings(self) -> dict[str, Any]:
        if isinstance(self.number_of_replicas, int):
            return {**INDEX_SETTINGS, "number_of_replicas": self.number_of_replicas, "auto_expand_replicas": False}
        return {**INDEX_SETTINGS, "auto_expand_replicas": self.number_of_replicas}

    @property
    def _required_copies(self) -> int | None:
        """Shard copies a write must have reached to count (None: judge no count, as for ``"all"``)."""
        return self._active_shards if isinstance(self._active_shards, int) else None

    def setup(self) -> None:
        """Create each lock index (an alias of one concrete index with the strict mapping) unless it exists."""
        drive(self._setup_steps(), self.perform)

    def _setup_steps(self) -> Steps[None]:
        if self._active_shards is None:
            self._active_shards = yield from self._active_shards_steps()
        if self._per_item_alias is None:
            info = yield from self._call_steps("read the cluster's version", StoreCall("info", {}))
            self._per_item_alias = answers.version(body_of(info)) >= (7, 10)
        for alias in self.lock_indices:
            yield from self._lock_index_steps(alias)
        yield from self._grant_pipeline_steps()
        self._index_ready = True

    # --- the lock index: an alias of its incarnation ---------------------------------
    #
    # Every write goes through the alias (with ``require_alias`` where the cluster
    # takes it), and every answer names the concrete index it landed in: an answer
    # from an index that is not the alias's incarnation (an index auto-created by a
    # write after the lock index was deleted, on clusters before 7.10) or a missing
    # alias sends the backend here, and the write is sent again. See the README,
    # "Restoring a lock store".

    def _floor_for(self, alias: str, concrete: str | None) -> int:
        """The token floor ``concrete`` (None: a new index) must have for this process to write to it.

        Every token this process saw in other incarnations of ``alias``, and OPTIONS
        ``token_floor``: a token of ``concrete`` must exceed them.
        """
        with self._sole_lock:
            floor = max(self.token_floor, self._past_high.get(alias, 0))
            if concrete is None or concrete != self._current.get(alias):
                floor = max(floor, self._current_high.get(alias, 0))
            return floor

    def _adopt(self, alias: str, concrete: str) -> None:
        """Write to ``concrete`` through ``alias`` from now on."""
        with self._sole_lock:
            if self._current.get(alias) == concrete:
                return
            if alias in self._current:
                self._past_high[alias] = max(self._past_high.get(alias, 0), self._current_high.get(alias, 0))
            self._current[alias] = concrete
            self._current_high[alias] = 0

    def _forget(self, alias: str, concrete: str) -> None:
        """Stop trusting ``concrete``: it went back (recreated or restored under its name); what it gave is past."""
        with self._sole_lock:
            if self._current.get(alias) == concrete:
                self._past_high[alias] = max(self._past_high.get(alias, 0), self._current_high.get(alias, 0))
                del self._current[alias]
                self._current_high[alias] = 0

    def _misplaced(
        self, action: Mapping[str, Any], item: Mapping[str, Any], sent: Mapping[str, tuple[str, int]]
    ) -> bool:
        """Return True if the ``_bulk`` item of ``action`` did not land in its lock index's incarnation.

        ``sent`` is, per lock index, the concrete index and the highest token
        position this process had seen answered there when the item was sent:
        a write sent after that answer comes later in the index's history,
        so a lower position means the index is not the one it was (deleted and
        created again, or restored from a snapshot, under the same name). An
        answer from another incarnation whose floor this process may accept
        (another process recreated the lock index) is adopted instead.
        """
        ((_, header),) = action.items()
        body = next(iter(item.values()))
        alias, concrete = header["_index"], body.get("_index")
        with self._sole_lock:
            current = self._current.get(alias)
        error = body.get("error")
        if error:
            if isinstance(error, Mapping) and error.get("type") == NOT_FOUND:
                return True
            if "pipeline" in header:
                return False  # failed in the grant pipeline, before any index was resolved or created
            # Elasticsearch before 7.10 creates a missing index even for a write that then fails (an update
            # of a document that is not there): the answer comes from that index, named like the alias.
            return concrete == alias and current != alias
        if not isinstance(concrete, str):
            return False
        if concrete != current:
            if concrete == alias or token_floor_of(concrete) < self._floor_for(alias, concrete):
                return True
            self._adopt(alias, concrete)
        written = answers.written_token(body) if body.get("result") in ("created", "updated", "deleted") else None
        if written is None:
            return False
        sent_to, seen = sent.get(alias, ("", 0))
        if concrete == sent_to and written <= seen:
            logger.warning(
                "lock index %s (%s) went back: a write got token position %d after %d was answered; replacing it",
                alias,
                concrete,
                written,
                seen,
            )
            self._forget(alias, concrete)
            return True
        with self._sole_lock:
            if self._current.get(alias) == concrete:
                self._current_high[alias] = max(self._current_high.get(alias, 0), written)
        return False

    def _lock_index_steps(self, alias: str) -> Steps[None]:
        """Make ``alias`` name a lock index this process may write to, creating or replacing its incarnation.

        Missing: create ``<alias>.floor-<floor>`` with the alias. An index whose
        floor is below what this process must honour (:meth:`_floor_for`), or an
        index named like the alias that a write auto-created, is replaced: the
        alias moves to a new incarnation in one atomic alias change that also
        deletes the old index, so of several processes doing it exactly one
        does. A concrete index named like the alias with the lock mapping (made
        by an earlier release) is used as it is (see check W008).
        """
        for _ in range(INCARNATION_TRIES):
            lookup = StoreCall("indices.get_mapping", {"index": alias}, options={"ignore_status": 404})
            found = body_of((yield from self._call_steps("look up the lock index", lookup)))
            indices = {
                name: v.get("mappings") or {} for name, v in found.items() if isinstance(v, Mapping) and "mappings" in v
            }
            if not indices:
                if (yield from self._create_incarnation_steps(alias)):
                    return
                continue
            if len(indices) > 1:
                raise LockBackendUnavailable(
                    f"Elasticsearch lock index {alias!r} is an alias of several indices ({', '.join(sorted(indices))}) "
                    f"({self.describe()}): it must name exactly one; remove the others from the alias"
                )
            ((concrete, mappings),) = indices.items()
            if not is_lock_mapping(mappings):
                if concrete == alias and auto_created(mappings):
                    yield from self._replace_steps(alias, concrete)
                    continue
                raise LockBackendUnavailable(
                    f"Elasticsearch index {concrete!r} is not a lock index ({self.describe()}): "
                    "point OPTIONS['index'] at another name"
                )
            floor = 0 if concrete == alias else token_floor_of(concrete)
            if floor >= self._floor_for(alias, concrete):
                yield from self._upgrade_steps(concrete, mappings)
                self._adopt(alias, concrete)
                return
            yield from self._replace_steps(alias, concrete)
        raise LockBackendUnavailable(
            f"Elasticsearch lock index {alias!r} kept changing while it was being set up ({self.describe()})"
        )

    def _create_incarnation_steps(self, alias: str) -> Steps[bool]:
        """Create the first (or next) incarnation of a missing ``alias``; False if another process got there first."""
        floor = self._floor_for(alias, None)
        name = incarnation(alias, floor)
        body = {"index": name, "settings": self._index_settings(), "mappings": MAPPING}
        create = StoreCall(
            "indices.create",
            {**body, "aliases": {alias: {"is_write_index": True}}, "wait_for_active_shards": self._active_shards},
        )
        try:
            yield from self._call_steps("create the lock index", create)
        except LockBackendUnavailable as e:
            if error_type(e) != ALREADY_EXISTS:
                if error_type(e) in TAKEN_BY_OTHERS:
                    return False
                raise
            # Ours by its name, but without the alias (a replacement that did not finish): give it the alias.
            add = StoreCall("indices.update_aliases", {"actions": [add_alias(name, alias)]})
            try:
                yield from self._call_steps("name the lock index", add)
            except LockBackendUnavailable as e:
                if error_type(e) in TAKEN_BY_OTHERS:
                    return False
                raise
        self._adopt(alias, name)
        with self._sole_lock:
            recreated = self._past_high.get(alias, 0) or self._current_high.get(alias, 0)
        if recreated or floor:
            logger.warning("created lock index %s as %s: every token exceeds %d", alias, name, floor)
        return True

    def _replace_steps(self, alias: str, old: str) -> Steps[None]:
        """Move ``alias`` from concrete index ``old`` to a new incarnation and delete ``old``, atomically.

        The alias change fails if ``old`` is gone (another process replaced it
        first): the new index is then deleted, unless it is the one the alias names.
        """
        floor = self._floor_for(alias, None)
        name = incarnation(alias, floor)
        body = {"index": name, "settings": self._index_settings(), "mappings": MAPPING}
        created = True
        try:
            yield from self._call_steps(
                "create the lock index",
                StoreCall("indices.create", {**body, "wait_for_active_shards": self._active_shards}),
            )
        except LockBackendUnavailable as e:
            if error_type(e) != ALREADY_EXISTS:
                raise
            created = False
        swap = StoreCall(
            "indices.update_aliases", {"actions": [{"remove_index": {"index": old}}, add_alias(name, alias)]}
        )
        try:
            yield from self._call_steps("replace the lock index", swap)
        except LockBackendUnavailable as e:
            if error_type(e) not in TAKEN_BY_OTHERS:
                raise
            if created:
                lookup = StoreCall("indices.get_alias", {"name": alias}, options={"ignore_status": 404})
                if name not in body_of((yield from self._call_steps("look up the lock index", lookup))):
                    drop = StoreCall("indices.delete", {"index": name}, options={"ignore_status": 404})
                    yield from self._call_steps("delete an unused lock index", drop)
            return
        logger.warning(
            "replaced lock index %s (%s, tokens not above %d) by %s: every token exceeds %d; holders it kept are lost",
            alias,
            old,
            floor,
            name,
            floor,
        )
        self._adopt(alias, name)

    def _upgrade_steps(self, concrete: str, mappings: Mapping[str, Any]) -> Steps[None]:
        """Add the fields of this release to a lock index of an earlier one (adding fields is allowed live)."""
        version = ((mappings.get("_meta") or {}).get("django_esdlock") or {}).get("mapping_version")
        if isinstance(version, int) and version >= MAPPING_VERSION:
            return
        upgrade = StoreCall(
            "indices.put_mapping", {"index": concrete, "properties": UPGRADE_PROPERTIES, "meta": MAPPING["_meta"]}
        )
        yield from self._call_steps("add the new fields to the lock index", upgrade)

    def concrete_indices(self) -> dict[str, str]:
        """Return each concrete lock index and the lock index (alias) it serves: the names to back up or delete."""
        return drive(self._concrete_indices_steps(), self.perform)

    def _concrete_indices_steps(self) -> Steps[dict[str, str]]:
        found: dict[str, str] = {}
        for alias in self.lock_indices:
            lookup = StoreCall("indices.get_mapping", {"index": alias}, options={"ignore_status": 404})
            for name, value in body_of((yield from self._call_steps("look up the lock index", lookup))).items():
                if isinstance(value, Mapping) and "mappings" in value:
                    found[name] = alias
        return found

    def delete_indices(self) -> None:
        """Delete every lock index with the concrete index behind it (tests and tools): every lock there is lost."""
        drive(self._delete_indices_steps(), self.perform)

    def _delete_indices_steps(self) -> Steps[None]:
        for name in (yield from self._concrete_indices_steps()):
            drop = StoreCall("indices.delete", {"index": name}, options={"ignore_status": 404})
            yield from self._call_steps("delete the lock index", drop)
        with self._sole_lock:
            self._index_ready = False

    def _active_shards_steps(self) -> Steps[int | str]:
        """Resolve ``wait_for_active_shards``: "auto" is a majority of the copies the cluster's data nodes keep."""
        if self.wait_for_active_shards != "auto":
            return self.wait_for_active_shards
        health = yield from self._call_steps("read the cluster's health", StoreCall("cluster.health", {}))
        copies = copies_of(self.number_of_replicas, max(1, int(health.get("number_of_data_nodes") or 1)))
        return copies // 2 + 1

    def _ensure_index_steps(self) -> Steps[None]:
        # Before the first write: an update would otherwise auto-create the
        # index with a dynamic mapping. Two callers may both set it up: that is safe.
        if not self._index_ready:
            yield from self._setup_steps()

    def _aliased(self, item_lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Return one item's ``_bulk`` lines, its action line saying ``require_alias`` where the cluster takes it.

        Then a write to a lock index that is gone fails (404) instead of
        creating an index with a dynamic mapping. Not for a concrete index of an
        earlier release (named like the lock index): it is no alias.
        """
        verb, header = next(iter(item_lines[0].items()))
        alias = header["_index"]
        with self._sole_lock:
            legacy = self._current.get(alias) == alias
        if not self._per_item_alias or legacy:
            return item_lines
        return [{verb: {**header, "require_alias": True}}, *item_lines[1:]]

    # --- checks ---------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        try:
            data_nodes, content_lengths, found = drive(self._cluster_facts_steps(), self.perform)
        except LockBackendUnavailable as e:
            return [
                checks.Error(
                    str(e),
                    hint="Start Elasticsearch or fix LOCK_BACKEND['OPTIONS']['hosts'].",
                    id="django_esdlock.E002",
                )
            ]
        errors = []
        for index, (mapping, settings) in found.items():
            concrete, body = next(iter(mapping.items()))
            actual = body["mappings"]
            properties = actual.get("properties")
            earlier = {
                1: ADDED_SINCE_VERSION_1 + ADDED_SINCE_VERSION_2 + ADDED_SINCE_VERSION_3 + ADDED_SINCE_VERSION_4,
                2: ADDED_SINCE_VERSION_2 + ADDED_SINCE_VERSION_3 + ADDED_SINCE_VERSION_4,
                3: ADDED_SINCE_VERSION_3 + ADDED_SINCE_VERSION_4,
                4: ADDED_SINCE_VERSION_4,
            }
            version = {
                1: PROPERTIES_OF_VERSION_1,
                2: PROPERTIES_OF_VERSION_2,
                3: PROPERTIES_OF_VERSION_3,
                4: PROPERTIES_OF_VERSION_4,
            }
            lacking = next((earlier[v] for v, props in version.items() if properties == props), None)
            if lacking is not None and actual.get("dynamic") == "strict":
                errors.append(
                    checks.Warning(
                        f"Elasticsearch index {index!r} has the lock mapping of an earlier release.",
                        hint=f"The backend adds {', '.join(lacking)} at its first use; until then "
                        "processes of this release cannot write there.",
                        id="django_esdlock.W006",
                    )
                )
            elif actual.get("dynamic") not in ("strict", False) or properties != MAPPING["properties"]:
                errors.append(
                    checks.Error(
                        f"Elasticsearch index {index!r} has a mapping that is not django-esdlock's lock mapping.",
                        hint="Point OPTIONS['index'] at a new index name, or delete the index when no lock is held.",
                        id="django_esdlock.E003",
                    )
                )
            if concrete == index:
                errors.append(
                    checks.Warning(
                        f"Elasticsearch lock index {index!r} is an index of an earlier release, not an alias: "
                        "if it is lost, fencing tokens may go back.",
                        hint="When no lock is held, delete it (the backend then creates the alias and its index), or "
                        "set OPTIONS['token_floor'] above the highest token given out: the next process replaces "
                        "it (see 'Restoring a lock store' in the operating docs).",
                        id="django_esdlock.W008",
                    )
                )
            elif token_floor_of(concrete) < self.token_floor:
                errors.append(
                    checks.Warning(
                        f"Elasticsearch lock index {index!r} gives tokens above {token_floor_of(concrete)}, below "
                        f"OPTIONS['token_floor'] {self.token_floor}.",
                        hint="The next process of these settings that writes replaces it by one above the floor "
                        "(its holders are lost then).",
                        id="django_esdlock.W009",
                    )
                )
            index_settings = next(iter(settings.values()))["settings"]["index"]
            shards = index_settings.get("number_of_shards")
            if str(shards) != "1":
                errors.append(
                    checks.Error(
                        f"Elasticsearch index {index!r} has {shards} primary shards; fencing tokens need exactly 1.",
                        hint="Recreate the lock index with one primary shard.",
                        id="django_esdlock.E004",
                    )
                )
            errors.extend(self._durability_warnings(index, index_settings, data_nodes))
            nested_limit = index_settings.get("mapping", {}).get("nested_objects", {}).get("limit")
            errors.extend(self._holders_warnings(index, int(nested_limit or NESTED_OBJECTS_LIMIT)))
        missing = [i for i in self.lock_indices if i not in found]
        if data_nodes > 1 and missing:  # judged by the settings they will be created with
            errors.extend(self._durability_warnings(missing[0], self._index_settings(), data_nodes, planned=True))
        if missing:
            errors.extend(self._holders_warnings(missing[0], NESTED_OBJECTS_LIMIT, planned=True))
        errors.extend(self._bulk_warnings(content_lengths))
        errors.extend(self._pipeline_warnings())
        errors.extend(self._clock_warnings())
        return errors

    def _cluster_facts_steps(self) -> Steps[tuple[int, list[int], dict[str, tuple[Any, Any]]]]:
        """Read what :meth:`check` judges: the data nodes, their ``http.max_content_length``, each lock index.

        One try of each call, 5 seconds at most (no busy retry, no resend): a
        check reports the store as it finds it.
        """
        quick = {"request_timeout": 5}
        with self._translate("reach the cluster"):
            health = yield StoreCall("cluster.health", {}, options=quick)
            data_nodes = int(health["number_of_data_nodes"])
            info = yield StoreCall("nodes.info", {"metric": "settings", "flat_settings": True}, options=quick)
            content_lengths = [
                size
                for node in info.get("nodes", {}).values()
                if (size := byte_size(node.get("settings", {}).get("http.max_content_length", "100mb")))
            ]
            found = {}
            for index in self.lock_indices:
                if (yield StoreCall("indices.exists", {"index": index}, options=quick)):
                    mapping = yield StoreCall("indices.get_mapping", {"index": index}, options=quick)
                    found[index] = (mapping, (yield StoreCall("indices.get_settings", {"index": index}, options=quick)))
        return data_nodes, content_lengths, found

    def _holders_warnings(self, index: str, nested_limit: int, *, planned: bool = False) -> list[checks.CheckMessage]:
        """Warn when ``max_holders_per_node`` lets a node keep more holders than the index's nested-objects limit."""
        if self.max_holders_per_node <= nested_limit:
            return []
        which = "would be created with" if planned else "has"
        return [
            checks.Warning(
                f"OPTIONS['max_holders_per_node'] is {self.max_holders_per_node:,}, but lock index {index!r} {which} "
                f"index.mapping.nested_objects.limit {nested_limit:,}: Elasticsearch refuses a node past it (400).",
                hint=f"Lower OPTIONS['max_holders_per_node'] to {nested_limit:,}, or raise the limit "
                f'(PUT {index}/_settings {{"index.mapping.nested_objects.limit": {self.max_holders_per_node}}}).',
                id="django_esdlock.W007",
            )
        ]

    def largest_bulk(self) -> int:
        """Return the bytes of the largest ``_bulk`` a request within the caps may send, about (an upper bound).

        A document lock of ``MAX_IDS_PER_REQUEST`` ids, each renewed with a
        checkpoint of ``MAX_CHECKPOINT_BYTES``, or a tree lock of the deepest
        path that carries an intent of ``MAX_INTENT_BYTES``; ids and paths of
        the longest key.
        """
        node = Node("n" * 100, Kind.DOCUMENT, "k" * paths.MAX_PATH_LENGTH)
        request = LockRequest(
            "h" * 32, Owner.current(), ((node, modes.Mode.X),), self.ttl, reentrant=True, ticket=time.time_ns()
        )
        holder = {"id": request.holder_id, "owner": request.owner.as_dict(), "has_intent": True}
        grant = Grant(request, 1 << 50, (node,))
        items = [
            self._acquire_items(request.targets, holder, request),
            self._fresh_item(node, modes.Mode.X, holder, request),
            self._scripted(node, scripts.RENEW, renew_params(grant, None, {"state": "running", "attempts": 99})),
        ]
        item = max(sum(len(json.dumps(line, ensure_ascii=False).encode()) + 1 for line in lines) for lines in items)
        documents = self.limits.ids_per_request * (item + self.limits.checkpoint_bytes)
        tree = paths.MAX_DEPTH * item + max(self.limits.intent_bytes, self.limits.checkpoint_bytes)
        return max(documents, tree)

    def _bulk_warnings(self, content_lengths: Sequence[int]) -> list[checks.CheckMessage]:
        """Warn when the caps let a request send a ``_bulk`` larger than a node's ``http.max_content_length``."""
        if not content_lengths:
            return []
        largest, limit = self.largest_bulk(), min(content_lengths)
        if largest <= limit:
            return []
        return [
            checks.Warning(
                f"LOCK_BACKEND's caps let one request send a _bulk of about {largest:,} bytes, over the "
                f"http.max_content_length of {limit:,} bytes of an Elasticsearch node: it would be refused (413).",
                hint="Lower LOCK_BACKEND['MAX_IDS_PER_REQUEST'], ['MAX_CHECKPOINT_BYTES'] or ['MAX_INTENT_BYTES'], "
                "or raise http.max_content_length on every node.",
                id="django_esdlock.W007",
            )
        ]

    def _durability_warnings(
        self, index: str, settings: Mapping[str, Any], data_nodes: int, *, planned: bool = False
    ) -> list[checks.CheckMessage]:
        """Warn when a lock index on a cluster of ``data_nodes`` cannot keep a grant through the loss of one node.

        It cannot when it would keep a single copy there, or when a write may be
        acknowledged by fewer than two copies (``wait_for_active_shards`` 1). A
        single-node cluster has no node to lose: nothing to warn about.
        """
        if data_nodes < 2:
            return []
        expand = settings.get("auto_expand_replicas")
        if expand not in (None, False, "false"):
            copies = copies_of(str(expand), data_nodes)
        else:
            copies = 1 + int(settings.get("number_of_replicas", 1))
        wait = self.wait_for_active_shards
        acked_by = copies // 2 + 1 if wait == "auto" else copies if wait == "all" else int(wait)
        if copies >= 2 and acked_by >= 2:
            return []
        which = "would be created" if planned else "is"
        reason = (
            f"keeps {copies} copy on {data_nodes} data nodes"
            if copies < 2
            else "acknowledges a write from the primary alone (wait_for_active_shards 1)"
        )
        return [
            checks.Warning(
                f"Elasticsearch lock index {index!r} {which} unable to keep a grant through the loss of one node: "
                f"it {reason}.",
                hint="Give it replicas (OPTIONS['number_of_replicas'], default '0-2', or "
                f"PUT {index}/_settings) and leave OPTIONS['wait_for_active_shards'] at 'auto' (a majority).",
                id="django_esdlock.W005",
            )
        ]
