"""Admin pages of held locks and waiting requests: what the active backend reports, for every backend."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import ngettext

from . import operations, signals
from .conf import get_backend
from .exceptions import LockError, LockStoreBusy
from .held_lock import HeldLock
from .modes import Mode
from .paths import ancestors, normalize_namespace, normalize_path
from .records import HolderRecord, Kind, Node, main_record
from .redaction import redact
from .waiting import SHOWN, WaitGraph, drawing, owner_label

_EXPIRED_CHOICES = {"yes": True, "no": False}


def _busy_or(error: Exception) -> str:
    """Say what a store error means to the person who clicked; a busy store only asks for patience."""
    if isinstance(error, LockStoreBusy):
        return redact(f"the lock store is busy, retry in a moment ({error})")
    return redact(error)


def _unreadable(error: Exception) -> str:
    if isinstance(error, LockStoreBusy):
        return redact(f"The lock store is busy, retry in a moment. Nothing was changed. ({error})")
    return redact(f"The lock store cannot be read: {error}")


@dataclasses.dataclass(frozen=True)
class ListFilters:
    """The changelist's GET parameters, validated, as ``backend.holders()`` keywords."""

    namespace: str | None = None
    mode: Mode | None = None
    host: str | None = None
    expired: bool | None = None
    q: str | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> ListFilters:
        """Raise ValueError (or InvalidLockPath) naming the bad parameter."""
        namespace = query.get("namespace") or None
        mode = query.get("mode") or None
        expired = query.get("expired") or None
        if expired is not None and expired not in _EXPIRED_CHOICES:
            raise ValueError(f"expired must be 'yes' or 'no', not {expired!r}")
        return cls(
            namespace=normalize_namespace(namespace) if namespace else None,
            mode=Mode(mode) if mode else None,
            host=query.get("host") or None,
            expired=_EXPIRED_CHOICES[expired] if expired else None,
            q=query.get("q") or None,
        )

    def backend_kwargs(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "mode": self.mode,
            "host": self.host,
            "expired": self.expired,
            "path_prefix": self.q,
        }

    def query(self, **changes: Any) -> str:
        """Return these filters (with ``changes``) as a query string, for links."""
        values = {
            "namespace": self.namespace,
            "mode": self.mode.value if self.mode else None,
            "host": self.host,
            "expired": {True: "yes", False: "no"}.get(self.expired),  # type: ignore[arg-type]
            "q": self.q,
            **changes,
        }
        return urlencode({k: v for k, v in values.items() if v})


def _delayed_until(record: HolderRecord) -> datetime.datetime | None:
    """Until when an expired holder still refuses its node (the lock delay), or None: it does not (any more)."""
    try:
        lock_delay = get_backend().lock_delay
    except (LockError, ImproperlyConfigured):
        return None
    if not lock_delay or record.intent or not record.expired:
        return None
    until = record.expires_at + datetime.timedelta(seconds=lock_delay)
    return until if until > datetime.datetime.now(datetime.UTC) else None


def _row(record: HolderRecord) -> dict[str, Any]:
    owner = record.owner
    return {
        "record": record,
        "delayed_until": _delayed_until(record),
        "owner": f"{owner.get('host', '?')} pid {owner.get('pid', '?')} {owner.get('thread_name', '')}".strip(),
        "intent": json.dumps(record.intent, sort_keys=True) if record.intent else "",
        "checkpoint": json.dumps(record.checkpoint, sort_keys=True) if record.checkpoint else "",
        "recovery": (record.recovery or {}).get("state", ""),
        "tree_path": record.node.key if record.node.kind is Kind.TREE else None,
    }


def _count_semaphores(rows: list[dict[str, Any]], backend: Any) -> None:
    """Give each semaphore's rows its holders listed / limit, and how many wait for it (where the store says)."""
    held: collections.Counter[Node] = collections.Counter(
        row["record"].node for row in rows if row["record"].node.kind is Kind.SEMAPHORE
    )
    if not held:
        return
    waiting: collections.Counter[Node] | None = None
    if backend.features.can_list_waiting:
        with contextlib.suppress(LockError):
            waiting = collections.Counter(w.node for w in backend.wait_state(sorted(held)).waiters)
    for row in rows:
        node = row["record"].node
        if node in held:
            row["semaphore"] = {
                "held": held[node],
                "limit": row["record"].holder_limit,
                "waiting": None if waiting is None else waiting[node],
            }


def _waiting_rows(graph: WaitGraph, limit: int) -> list[dict[str, Any]]:
    """One row per waiting request, with the edges out of it, oldest request first; the first ``limit``."""
    now = datetime.datetime.now(datetime.UTC)
    in_cycle, victims = graph.cycle_edges, graph.victims
    members = {r.holder_id for cycle in graph.cycles for r in cycle.requests}
    waiting_of: dict[str, str] = {}
    for r in graph.requests:
        waiting_of.setdefault(r.owner_key, r.holder_id)
    shown = graph.requests[:limit]
    out_of: dict[str, list[Any]] = {r.holder_id: [] for r in shown}
    for e in graph.edges:
        if e.waiter in out_of:
            out_of[e.waiter].append(e)
    rows = []
    for r in shown:
        since = r.markers[0].since
        edges = [
            {
                "edge": e,
                "blocker_owner": graph.blocker_label(e),
                "blocker_waits": waiting_of.get(e.blocker_owner),
                "cycle": e.key in in_cycle,
            }
            for e in out_of[r.holder_id]
        ]
        rows.append(
            {
                "request": r,
                "owner": owner_label(r.owner),
                "since": since,
                "waited": max(0.0, (now - since).total_seconds()),
                "waits_for": [(m.node, m.mode.value) for m in r.markers],
                "edges": edges,
                "lines": edges or [{}],  # a request whose blockers just left still gets its line
                "span": max(1, len(edges)),
                "cycle": r.holder_id in members,
                "victim": r.holder_id in victims,
            }
        )
    return rows


def _cycle_rows(graph: WaitGraph, limit: int) -> list[dict[str, Any]]:
    return [
        {
            "cycle": cycle,
            "victim": cycle.victim,
            "victim_owner": owner_label(cycle.victim.owner),
            "steps": [
                {
                    "request": r,
                    "owner": owner_label(r.owner),
                    "edge": e,
                    "blocker_owner": graph.blocker_label(e),
                }
                for r, e in zip(cycle.requests, cycle.edges, strict=True)
            ],
        }
        for cycle in graph.cycles[:limit]
    ]


@admin.register(HeldLock)
class HeldLockAdmin(admin.ModelAdmin):
    """Lists holders through the backend (never the ORM); force release and reap as POST actions."""

    list_per_page = 100
    waiting_rows = SHOWN
    """The waiting page shows the oldest this many waiting requests and the first this many deadlocks."""
    change_list_template = "admin/django_esdlock/heldlock/change_list.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list:
        info = self.opts.app_label, self.opts.model_name
        view = self.admin_site.admin_view
        return [
            path("", view(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path("tree/", view(self.tree_view), name="{}_{}_tree".format(*info)),
            path("waiting/", view(self.waiting_view), name="{}_{}_waiting".format(*info)),
            path("release/", view(self.force_release_view), name="{}_{}_release".format(*info)),
            path("reap/", view(self.reap_view), name="{}_{}_reap".format(*info)),
        ]

    def _url(self, name: str) -> str:
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{name}")

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        lock_delay = 0.0
        try:
            backend = get_backend()
            backend_name, lock_delay = redact(backend.describe()), backend.lock_delay
        except (LockError, ImproperlyConfigured) as e:
            backend_name = redact(f"misconfigured: {e}")
        return {
            "lock_delay": lock_delay,
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "backend_name": backend_name,
            "can_release": self.has_delete_permission(request),
            "changelist_url": self._url("changelist"),
            "tree_url": self._url("tree"),
            "waiting_url": self._url("waiting"),
            "release_url": self._url("release"),
            "reap_url": self._url("reap"),
            **extra,
        }

    # --- the list -----------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        error = None
        rows: list[dict[str, Any]] = []
        next_url = None
        try:
            filters = ListFilters.from_query(request.GET)
        except ValueError as e:
            filters, error = ListFilters(), f"Invalid filter: {e}"
        if error is None:
            try:
                page = get_backend().holders(
                    **filters.backend_kwargs(), cursor=request.GET.get("cursor") or None, limit=self.list_per_page
                )
            except (LockError, ValueError) as e:
                error = _unreadable(e)
            else:
                rows = [_row(r) for r in page.holders]
                _count_semaphores(rows, get_backend())
                if page.next_cursor:
                    next_url = "?" + filters.query(cursor=page.next_cursor)
        context = self._context(
            request,
            "Held locks",
            rows=rows,
            error=error,
            filters=filters,
            modes=[m.value for m in Mode],
            next_url=next_url,
            first_url="?" + filters.query() if request.GET.get("cursor") else None,
            **(extra_context or {}),
        )
        return TemplateResponse(request, self.change_list_template, context)

    # --- the tree -------------------------------------------------------------

    def tree_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        error = None
        node_rows: list[dict[str, Any]] = []
        children: dict[str, list[dict[str, Any]]] = {}
        namespace, tree_path, next_url = "default", "", None
        try:
            namespace = normalize_namespace(request.GET.get("namespace") or "default")
            tree_path = normalize_path(request.GET["path"]) if request.GET.get("path") else ""
            backend = get_backend()
            if tree_path:
                node_rows = [_row(r) for r in backend.node_holders(Node(namespace, Kind.TREE, tree_path))]
            page = backend.holders(
                namespace=namespace,
                parent=tree_path,
                cursor=request.GET.get("cursor") or None,
                limit=self.list_per_page,
            )
            for record in page.holders:
                children.setdefault(record.node.key, []).append(_row(record))
            if page.next_cursor:
                next_url = "?" + urlencode({"namespace": namespace, "path": tree_path, "cursor": page.next_cursor})
        except (LockError, ValueError) as e:
            error = _unreadable(e)
        crumbs = [{"path": p, "name": p.rsplit("/", 1)[1]} for p in ancestors(tree_path)] if tree_path else []
        context = self._context(
            request,
            f"Lock tree of namespace {namespace}",
            error=error,
            namespace=namespace,
            tree_path=tree_path,
            crumbs=crumbs,
            node_rows=node_rows,
            children=sorted(children.items()),
            next_url=next_url,
        )
        return TemplateResponse(request, "admin/django_esdlock/heldlock/tree.html", context)

    # --- the wait-for graph ------------------------------------------------------

    def waiting_view(self, request: HttpRequest) -> HttpResponse:
        """Who waits for whom now: every waiting request, the holders or earlier requests it waits for, deadlocks."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        error = None
        graph = None
        namespace = None
        try:
            namespace = normalize_namespace(request.GET["namespace"]) if request.GET.get("namespace") else None
            backend = get_backend()
            if backend.features.can_list_waiting:
                graph = WaitGraph.of(backend.wait_state(), namespace)
            else:
                error = f"This lock store cannot list waiting requests: {backend.describe()}"
        except (LockError, ValueError) as e:
            error = _unreadable(e)
        limit = self.waiting_rows
        context = self._context(
            request,
            "Waiting requests",
            error=error,
            namespace=namespace or "",
            graph=graph,
            requests=_waiting_rows(graph, limit) if graph else [],
            cycles=_cycle_rows(graph, limit) if graph else [],
            more_requests=max(0, len(graph.requests) - limit) if graph else 0,
            more_cycles=max(0, len(graph.cycles) - limit) if graph else 0,
            drawing=drawing(graph) if graph else None,
        )
        return TemplateResponse(request, "admin/django_esdlock/heldlock/waiting.html", context)

    # --- actions -----------------------------------------------------------------

    def force_release_view(self, request: HttpRequest) -> HttpResponse:
        """POST holder ids: ask for confirmation, then release each holder that is still the one shown.

        A holder that carries an intent is recovered (its handler run, then
        released) unless the confirmation explicitly discards the intent.
        """
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_delete_permission(request):
            raise PermissionDenied
        holder_ids = list(dict.fromkeys(request.POST.getlist("holder")))
        back = self._url("changelist") + ("?" + request.POST["back"] if request.POST.get("back") else "")
        if not holder_ids:
            self.message_user(request, "Select at least one holder to release.", messages.WARNING)
            return HttpResponseRedirect(back)
        backend = get_backend()
        try:
            found = {holder_id: backend.holder_records(holder_id) for holder_id in holder_ids}
        except LockError as e:
            self.message_user(request, _unreadable(e), messages.ERROR)
            return HttpResponseRedirect(back)
        tasks = operations.background_tasks()
        if request.POST.get("confirm") != "yes":
            context = self._context(
                request,
                "Force release: are you sure?",
                holders=[_confirmation(holder_id, records) for holder_id, records in found.items()],
                back=request.POST.get("back", ""),
                tasks=tasks,
            )
            return TemplateResponse(request, "admin/django_esdlock/heldlock/release_confirmation.html", context)
        released = 0
        for holder_id, records in found.items():
            if not records:
                continue
            main = main_record(records)
            seen = request.POST.get(f"seen-{holder_id}")
            if seen is not None and seen != main.owner_key:
                self.message_user(
                    request,
                    f"Holder {holder_id} changed hands since you confirmed "
                    f"({operations.holder_repr(main)}): left held.",
                    messages.WARNING,
                )
                continue
            try:
                if any(r.intent for r in records):
                    released += self._release_with_intent(request, backend, holder_id, records, seen, tasks)
                elif operations.force_release(backend, records, request.user.pk, discard_intent=False):
                    released += 1
                    signals.send(
                        signals.lock_force_released, sender=type(self), holder=main, records=records, user=request.user
                    )
                else:
                    self._changed(request, holder_id)
            except LockError as e:
                self.message_user(request, f"Releasing {holder_id} failed: {_busy_or(e)}", messages.ERROR)
        if released:
            self.message_user(
                request,
                ngettext("Released %(count)d holder.", "Released %(count)d holders.", released) % {"count": released},
                messages.SUCCESS,
            )
        return HttpResponseRedirect(back)

    def _changed(self, request: HttpRequest, holder_id: str) -> None:
        self.message_user(
            request,
            f"Holder {holder_id} changed since it was read (renewed, claimed or taken over): left held. "
            "Look again before you release it.",
            messages.WARNING,
        )

    def _release_with_intent(
        self,
        request: HttpRequest,
        backend: Any,
        holder_id: str,
        records: list[HolderRecord],
        seen: str | None,
        tasks: str | None,
    ) -> int:
        """Recover (the default) or, if explicitly chosen, discard the intent and release; return 1 if released."""
        choice = request.POST.get(f"intent-{holder_id}")
        main = main_record(records)
        if choice == "discard":
            if not operations.force_release(backend, records, request.user.pk, discard_intent=True):
                self._changed(request, holder_id)
                return 0
            signals.send(
                signals.lock_force_released, sender=type(self), holder=main, records=records, user=request.user
            )
            self.message_user(
                request,
                f"Discarded the intent of holder {holder_id}: its change will not be recovered.",
                messages.WARNING,
            )
            return 1
        if choice != "recover":
            self.message_user(
                request,
                f"Holder {holder_id} carries an intent: choose to recover it or to discard it. Nothing was done.",
                messages.ERROR,
            )
            return 0
        if tasks:
            from . import maintenance  # the Tasks framework, only where a task backend is configured

            task_id = maintenance.enqueue_recover(holder_id, seen or main.owner_key, request.user.pk)
            message = f"Recovery of holder {holder_id} enqueued as task {task_id} ({tasks}): a worker runs its handler."
            operations.log(request.user.pk, holder_id, operations.holder_repr(main), CHANGE, message)
            self.message_user(request, message, messages.SUCCESS)
            return 0
        outcome = operations.recover_now(
            holder_id, seen or main.owner_key, request.user.pk, how="inline: no task backend is configured"
        )
        self.message_user(request, outcome.message, messages.SUCCESS if outcome.ok else messages.WARNING)
        return 0

    def reap_view(self, request: HttpRequest) -> HttpResponse:
        """POST: remove expired holders and recover those with an intent, as reap_locks does.

        As a task when a task backend that runs apart from the request is
        configured (Django's Tasks framework), else in this request (the
        message says so); logged either way.
        """
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_delete_permission(request):
            raise PermissionDenied
        tasks = operations.background_tasks()
        try:
            if tasks:
                from . import maintenance  # the Tasks framework, only where a task backend is configured

                task_id = maintenance.enqueue_reap(request.user.pk)
                message = (
                    f"Reaping enqueued as task {task_id} ({tasks}): a worker removes expired holders and runs "
                    "the recovery handlers."
                )
                operations.log(request.user.pk, operations.REAP_OBJECT, "reap_locks", CHANGE, message)
                self.message_user(request, message, messages.SUCCESS)
                return HttpResponseRedirect(self._url("changelist"))
            report = operations.reap_now(request.user.pk, how="inline: no task backend is configured")
        except LockError as e:
            self.message_user(request, f"Reaping failed: {_busy_or(e)}", messages.ERROR)
        else:
            count = len(report.evicted)
            self.message_user(
                request,
                "Ran in this request (no task backend is configured). "
                + ngettext("Removed %(count)d expired holder.", "Removed %(count)d expired holders.", count)
                % {"count": count}
                + (f" Recovered {len(report.recovered)}." if report.recovered else "")
                + (f" Released {len(report.finished)} recovered earlier." if report.finished else "")
                + (f" {len(report.failed)} failed." if report.failed else ""),
                messages.SUCCESS if not report.failed else messages.WARNING,
            )
        return HttpResponseRedirect(self._url("changelist"))


def _confirmation(holder_id: str, records: list[HolderRecord]) -> dict[str, Any]:
    """What the confirmation page shows of one holder: its rows, its intent and the choices it offers."""
    intent = next((r.intent for r in records if r.intent), None)
    main = main_record(records) if records else None
    return {
        "holder_id": holder_id,
        "rows": [_row(r) for r in records],
        "seen": main.owner_key if main else "",
        "intent": json.dumps(intent, sort_keys=True) if intent else "",
        "op": (intent or {}).get("op"),
        "recoverable": operations.handler_of(records),
    }
