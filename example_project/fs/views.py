"""The example's pages: browse, search and rename the file system, and see the locks held in it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from elasticsearch import ApiError, TransportError

from django_esdlock import LockError, LockTimeout, LockUnavailable, get_backend
from django_esdlock.exceptions import InvalidLockPath

from .aio import arename
from .documents import ROOT, clean_path, es_url, fs_index, is_within, parent_of
from .forms import RenameForm, lock_wait
from .held import blockers, locks_around
from .renames import RenameError, RenameInterrupted, RenameResult, rename
from .tasks import UNFINISHED, TaskResultDoesNotExist, enqueue_rename, rename_task
from .templatetags.fs_tags import browse_url

LISTING_LIMIT = 500


def store_errors(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Render a 503 page naming the store when Elasticsearch or the lock store does not answer."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except (ApiError, TransportError, LockError) as e:
            return _unavailable(request, e)

    return wrapper


def _unavailable(request: HttpRequest, error: Exception) -> HttpResponse:
    """The 503 page naming the stores and the error."""
    context = {
        "error": f"{type(error).__name__}: {error}",
        "es_url": es_url(),
        "lock_store": get_backend().describe(),
        "path": ROOT,
    }
    return render(request, "fs/unavailable.html", context, status=503)


def _common(path: str, *, scope: str | None = None) -> dict[str, Any]:
    """Return what every page shows: the stores, and the locks held on and under ``path``.

    ``scope`` is the directory the header's search box offers to search in.
    """
    index = fs_index()
    return {
        "path": path,
        "scope": path if scope is None else scope,
        "index": index,
        "es_url": es_url(),
        "lock_store": get_backend().describe(),
        "locks": locks_around(path),
        "lock_wait": lock_wait(),
    }


@require_GET
@store_errors
def browse(request: HttpRequest, path: str = "") -> HttpResponse:
    """Show a directory's entries (or a file's content), with rename forms and the locks held in it."""
    try:
        path = clean_path("/" + path)
    except InvalidLockPath:
        return render(request, "fs/missing.html", {"path": "/" + path}, status=404)
    index = fs_index()
    entry = index.at(path)
    if entry is None:
        return render(request, "fs/missing.html", {"path": path}, status=404)
    context = {**_common(path, scope=path if entry.is_dir else entry.parent), "entry": entry}
    if not entry.is_dir:
        return render(request, "fs/file.html", {**context, "file": index.get(entry.id)})
    children = index.children(path, limit=LISTING_LIMIT)
    context.update(
        children=children,
        truncated=len(children) >= LISTING_LIMIT,
        total=index.count(path) - (path != ROOT),  # the directory's own document is not "below"
        # Readers take no lock here: say so when a rename is moving documents in view.
        renaming=[held for held in context["locks"] if held.mode == "X" and held.intent],
    )
    return render(request, "fs/browse.html", context)


@require_GET
@store_errors
def search(request: HttpRequest) -> HttpResponse:
    """Full-text search of file names and contents, optionally within a directory."""
    text = request.GET.get("q", "").strip()
    try:
        within = clean_path(request.GET.get("in") or ROOT)
    except InvalidLockPath:
        within = ROOT
    hits, results = fs_index().search(text, within=within) if text else (0, [])
    return render(request, "fs/search.html", {**_common(within), "q": text, "hits": hits, "results": results})


def _rename_form(request: HttpRequest) -> tuple[RenameForm, str]:
    """Return the bound rename form and the page to go back to (the root when ``next`` is not a path)."""
    try:
        viewing = clean_path(request.POST.get("next") or ROOT)
    except InvalidLockPath:
        viewing = ROOT
    return RenameForm(request.POST), viewing


def _report_invalid(request: HttpRequest, form: RenameForm) -> None:
    for errors in form.errors.values():
        for error in errors:
            messages.error(request, f"Not renamed: {error}")


def _report(
    request: HttpRequest,
    data: dict[str, Any],
    viewing: str,
    *,
    result: RenameResult | None = None,
    error: Exception | None = None,
    held: str = "",
    how: str = "",
) -> HttpResponseRedirect:
    """Say how a rename went with a message; redirect back to the page viewed (followed, if it was renamed).

    ``held`` names who holds the locks, for a LockUnavailable ``error``;
    ``how`` is added to the success message (which view did it).
    """
    src, dst, timeout = data["src"], data["dst"], data["timeout"]
    if isinstance(error, LockTimeout):  # a LockUnavailable too: first
        messages.warning(
            request,
            f"Timed out: waited {timeout:g}s for the locks on {src} and {dst}, still held: {held}. "
            "Nothing was changed.",
            extra_tags="timeout",
        )
    elif isinstance(error, LockUnavailable):
        messages.error(
            request,
            f"Conflict: {src} cannot be renamed now, another operation holds a lock on it or on {dst}: "
            f"{held}. Nothing was changed; try again when it is released.",
            extra_tags="conflict",
        )
    elif isinstance(error, RenameInterrupted):
        messages.error(
            request,
            f"{error}. Its locks keep both paths blocked; manage.py reap_locks finishes it once their lease runs out.",
        )
    elif isinstance(error, RenameError):
        messages.error(request, f"Not renamed: {error}")
    elif isinstance(error, LockError):
        messages.error(request, f"Not renamed: the lock store failed ({error}).")
    elif error is not None:
        raise error
    else:
        assert result is not None
        messages.success(
            request,
            f"Renamed {src} to {dst}: {result.moved} document(s) moved in {result.seconds:.2f}s "
            f"under fencing token {result.token}{how}.",
            extra_tags="renamed",
        )
        if is_within(viewing, src):
            viewing = dst + viewing[len(src) :]
    return HttpResponseRedirect(browse_url(viewing))


@require_POST
@store_errors
def rename_view(request: HttpRequest) -> HttpResponse:
    """Rename a file or directory under lock_tree; say how it went with a message, back on the page viewed."""
    form, viewing = _rename_form(request)
    if not form.is_valid():
        _report_invalid(request, form)
        return HttpResponseRedirect(browse_url(viewing))
    data = form.cleaned_data
    try:
        result = rename(fs_index(), data["src"], data["dst"], timeout=data["timeout"])
    except (RenameError, LockError) as e:
        held = blockers([data["src"], data["dst"]]) if isinstance(e, LockUnavailable) else ""
        return _report(request, data, viewing, error=e, held=held)
    return _report(request, data, viewing, result=result)


async def arename_view(request: HttpRequest) -> HttpResponse:
    """The async twin of :func:`rename_view`: ``alock_tree`` and ``AsyncElasticsearch`` (``aio.arename``).

    While it waits for a lock the request's task sleeps on the event loop,
    holding no thread. Only the conflict message's list of holders (the lock
    backend's blocking listing) and the 503 page's store description run in
    a worker thread (``sync_to_async``). No ``require_POST``/``store_errors``
    decorators: before Django 5.0 they turn a coroutine function into a sync
    view.
    """
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    form, viewing = _rename_form(request)
    if not form.is_valid():
        _report_invalid(request, form)
        return HttpResponseRedirect(browse_url(viewing))
    data = form.cleaned_data
    try:
        result = await arename(es_url(), fs_index().name, data["src"], data["dst"], timeout=data["timeout"])
    except (RenameError, LockError) as e:
        try:
            held = await sync_to_async(blockers)([data["src"], data["dst"]]) if isinstance(e, LockUnavailable) else ""
        except (ApiError, TransportError, LockError) as store_error:
            return await sync_to_async(_unavailable)(request, store_error)
        return _report(request, data, viewing, error=e, held=held)
    except (ApiError, TransportError) as e:
        return await sync_to_async(_unavailable)(request, e)
    return _report(request, data, viewing, result=result, how=" (async view)")


@require_POST
@store_errors
def rename_task_view(request: HttpRequest) -> HttpResponse:
    """Lock and check the rename here, hand its locks to a background task, and show the task's page."""
    form, viewing = _rename_form(request)
    if not form.is_valid():
        _report_invalid(request, form)
        return HttpResponseRedirect(browse_url(viewing))
    data = form.cleaned_data
    try:
        result = enqueue_rename(fs_index(), data["src"], data["dst"], timeout=data["timeout"])
    except (RenameError, LockError) as e:
        held = blockers([data["src"], data["dst"]]) if isinstance(e, LockUnavailable) else ""
        return _report(request, data, viewing, error=e, held=held)
    return HttpResponseRedirect(reverse("fs:task", args=[result.id]))


@require_GET
@store_errors
def task_view(request: HttpRequest, result_id: str) -> HttpResponse:
    """A rename task's state, and the locks its worker holds; the page reloads itself until the task ends."""
    try:
        result = rename_task.get_result(result_id)
    except (TaskResultDoesNotExist, ValidationError, ValueError):
        return render(request, "fs/missing.html", {"path": f"task {result_id}"}, status=404)
    src, dst = result.args[0], result.args[1]
    context = {
        **_common(parent_of(src)),
        "result": result,
        "status": result.status.value if hasattr(result.status, "value") else str(result.status),
        "unfinished": result.status in UNFINISHED,
        "src": src,
        "dst": dst,
        "outcome": result.return_value if result.status == "SUCCESSFUL" else None,
        "error": result.errors[-1] if result.errors else None,
    }
    return render(request, "fs/task.html", context)
