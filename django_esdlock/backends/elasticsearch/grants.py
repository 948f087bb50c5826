"""Fresh nodes the chapter's way: a plain ``create``, its lease stamped by the store through an ingest pipeline.

A node that does not exist is taken with a ``create`` (in the acquire's one
``_bulk``) that names the grant pipeline: its ``set`` processor reads the
ingest node's clock (``_ingest.timestamp``) and its script
(:data:`.scripts.GRANT`) turns each holder's ``lease_ms`` into
``acquired_at`` and ``expires_at``. A ``create`` refused with 409 (the node
exists) is taken by the ACQUIRE script in the acquire's second ``_bulk``, as
before.

Whose clock is it? The ingest node's: the node that received the request
when it has the ingest role (every node has it by default), else one the
cluster forwards to. That reading is the real time there, not the cached
``ctx._now`` that stamps a renewal and judges every expiry (the primary
shard's node, up to ``thread_pool.estimated_time_interval`` behind): on one
node, a fresh lease can only end later than the store judges, never earlier.
Across nodes, the two clocks differ by their skew, which the holder's
``lease_margin`` covers as it covers the cached clock.

A ``_bulk`` that also takes nodes known to exist (with the ACQUIRE script, an
upsert) takes its fresh nodes with the scripted upsert :data:`.scripts.CREATE`:
Elasticsearch 7.0 fails an upsert sent through an alias in a ``_bulk`` where
another item names a pipeline ("pipeline with id [null] does not exist"; it
looks for the index's default pipeline by the alias's name and finds none).
Uncontended, every node is fresh and every item a ``create``.

Where the pipeline cannot be used (no node has the ingest role, or these
credentials may not install it and nobody else did), fresh nodes are taken
with the scripted upsert :data:`.scripts.CREATE`, as earlier releases
always did, and ``manage.py check`` says why (``django_esdlock.W010``).
"""

from __future__ import annotations

import logging
from typing import Any

from django.core import checks

from ... import modes
from ...exceptions import LockBackendUnavailable
from ...records import LockRequest, Node
from ...steps import Steps, drive
from . import scripts
from .protocol import holder_entry, node_fields
from .transport import StoreCall, error_type

logger = logging.getLogger("django_esdlock")

PIPELINE_VERSION = 1
"""The grant pipeline's ``version``: a new body gets a new number, and a new id (two releases may share a cluster)."""

DEFAULT_PIPELINE = f"esdlock-grant-v{PIPELINE_VERSION}"
"""``OPTIONS['grant_pipeline']``'s default id."""

REFUSALS = ("security_exception", "cluster_block_exception")
"""Errors that mean these credentials (or a read-only cluster) may not do it: fall back, do not fail the lock."""

UNREADABLE = "these credentials may not read the nodes' roles or the ingest pipelines"
NO_INGEST_NODE = "no node of the cluster has the ingest role"

PIPELINE_STRIKES = 2
"""Failed creates through the pipeline, with no create working between them, after which a backend gives it up."""


def pipeline_body() -> dict[str, Any]:
    """Return the grant pipeline as ``PUT _ingest/pipeline/<id>`` takes it."""
    return {
        "description": "django-esdlock: stamps the lease of a lock node created with a plain create",
        "version": PIPELINE_VERSION,
        "processors": [
            {"set": {"field": "lease_stamp", "value": "{{_ingest.timestamp}}"}},
            {"script": {"lang": "painless", "source": scripts.compact(scripts.GRANT)}},
        ],
    }


def is_ours(found: Any) -> bool:
    """Return whether a pipeline as ``GET _ingest/pipeline`` shows it is this release's grant pipeline."""
    if not isinstance(found, dict):
        return False
    wanted = pipeline_body()
    return found.get("version") == wanted["version"] and found.get("processors") == wanted["processors"]


class GrantPipeline:
    """Installs and verifies the grant pipeline; builds the ``create`` of a fresh node, or its scripted stand-in.

    A mixin of the backend: ``grant_pipeline`` (``OPTIONS``; None: never a
    pipeline) names the pipeline; :attr:`_pipeline` is the id in use once
    verified, None before that or when it cannot be used (:attr:`_pipeline_why`
    then says why).
    """

    def _init_grants(self, grant_pipeline: str | None) -> None:
        self.grant_pipeline = grant_pipeline
        self._pipeline: str | None = None
        self._pipeline_checked = grant_pipeline is None
        """Whether the pipeline was verified (or given up on) since setup or its last failure."""
        self._pipeline_why = "OPTIONS['grant_pipeline'] is None" if grant_pipeline is None else ""
        self._pipeline_strikes = 0
        """Creates through the pipeline that failed since one last worked (see :meth:`_pipeline_failed`)."""

    def _pipeline_facts_steps(self) -> Steps[tuple[int, Any]]:
        """Read how many nodes have the ingest role, and the grant pipeline as installed (None if it is not).

        -1 nodes: these credentials may not read them (see :data:`REFUSALS`).
        """
        name = self.grant_pipeline
        ingest = StoreCall("nodes.info", {"node_id": "ingest:true", "metric": "ingest", "filter_path": "_nodes"})
        get = StoreCall("ingest.get_pipeline", {"id": name}, options={"ignore_status": 404})
        try:
            total = ((yield from self._call_steps("count the ingest nodes", ingest)).get("_nodes") or {}).get("total")
            found = (yield from self._call_steps("read the grant pipeline", get)).get(name)
        except LockBackendUnavailable as e:
            if error_type(e) not in REFUSALS:
                raise
            return -1, None
        return int(total or 0), found

    def _grant_pipeline_steps(self) -> Steps[None]:
        """Verify the grant pipeline once: some node has the ingest role, and it is installed (install it if not).

        A failure to reach the store is raised (the caller's write would fail
        the same way); a cluster that cannot run it, or credentials that may
        not install it, leave :attr:`_pipeline` None: fresh nodes are then
        taken with the scripted upsert.
        """
        if self._pipeline_checked:
            return
        name = self.grant_pipeline
        ingest_nodes, found = yield from self._pipeline_facts_steps()
        why = UNREADABLE if ingest_nodes < 0 else NO_INGEST_NODE if ingest_nodes == 0 else ""
        if ingest_nodes > 0 and not is_ours(found):
            put = StoreCall("ingest.put_pipeline", {"id": name, **pipeline_body()})
            try:
                yield from self._call_steps("install the grant pipeline", put, retry_for=0)
            except LockBackendUnavailable as e:
                if error_type(e) not in REFUSALS:
                    raise
                why = f"these credentials may not install ingest pipeline {name!r}, and it is not installed"
        with self._sole_lock:
            self._pipeline = None if why else name
            self._pipeline_why = why
            self._pipeline_checked = True
        if why:
            logger.warning("Fresh lock nodes are taken with a scripted upsert, not create: %s", why)

    def _pipeline_failed(self, reason: str) -> None:
        """A ``create`` through the pipeline failed: verify it again before the next (it may have been deleted).

        When creates fail again right after it was verified, give it up:
        fresh nodes are then taken with the scripted upsert, as without it.
        """
        with self._sole_lock:
            self._pipeline_strikes += 1
            given_up = self._pipeline_strikes >= PIPELINE_STRIKES
            self._pipeline, self._pipeline_checked = None, given_up
            if given_up:
                self._pipeline_why = f"creates through ingest pipeline {self.grant_pipeline!r} fail: {reason}"
        if given_up:
            logger.warning("Fresh lock nodes are taken with a scripted upsert, not create: %s", self._pipeline_why)
        else:
            logger.warning("A create through the grant pipeline failed (%s): the pipeline is checked again", reason)

    def _pipeline_worked(self) -> None:
        """A ``create`` through the pipeline took its node: it works."""
        self._pipeline_strikes = 0

    def _fresh_item(
        self, node: Node, mode: modes.Mode, holder: dict[str, Any], request: LockRequest, *, plain: bool = True
    ) -> list[dict[str, Any]]:
        """Return the ``_bulk`` lines that take a node that may not exist: ``create`` with the pipeline, or CREATE.

        ``plain`` False asks for CREATE: the ``_bulk`` also carries upserts.
        """
        fresh = {**node_fields(node), "lock_type": modes.lock_type([mode]), "lock_count": 1, "modes": [mode.value]}
        if request.holder_limit is not None:
            fresh["holder_limit"] = request.holder_limit  # its first holder's limit stands
        entry = holder_entry(holder, mode, request)
        pipeline = self._pipeline
        if pipeline is None or not plain:
            params = {"holder": entry, "ttl_ms": request.ttl_ms, "fresh": fresh}
            fields = ["holders.id"] if request.ticket is not None else None
            return self._scripted(node, scripts.CREATE, params, fields=fields, scripted_upsert=True, upsert={})
        header = {"_index": self.index_of(node.namespace), "_id": node.id, "pipeline": pipeline}
        return [{"create": header}, {**fresh, "holders": [{**entry, "lease_ms": request.ttl_ms}]}]

    def _pipeline_warnings(self) -> list[checks.CheckMessage]:
        """``check``'s word on the grant pipeline (reads only): a warning when fresh nodes cannot use ``create``."""
        if self.grant_pipeline is None:
            return []  # meant: the scripted upsert
        try:
            ingest_nodes, found = drive(self._pipeline_facts_steps(), self.perform)
        except LockBackendUnavailable:
            return []  # the store's own error says it (django_esdlock.E002)
        if ingest_nodes > 0 and (found is None or is_ours(found)):
            return []  # installed, or installed by the first write
        if ingest_nodes < 0:
            why = UNREADABLE
        elif not ingest_nodes:
            why = NO_INGEST_NODE
        else:
            why = f"ingest pipeline {self.grant_pipeline!r} is not this release's (the first write replaces it)"
        return [
            checks.Warning(
                f"Fresh lock nodes are taken with a scripted upsert, not the chapter's create: {why}.",
                hint="Give a node the ingest role, or install the pipeline with credentials that may "
                "(manage_ingest_pipelines); or set OPTIONS['grant_pipeline'] = None to say a scripted upsert is "
                "meant. Locks work either way.",
                id="django_esdlock.W010",
            )
        ]
