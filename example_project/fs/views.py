"""The example's pages: browse, search and rename the file system, and see the locks held in it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST
from elasticsearch import ApiError, TransportError

from django_esdlock import LockError, LockTimeout, LockUnavailable, get_backend
from django_esdlock.exceptions import InvalidLockPath

from .documents import ROOT, clean_path, es_url, fs_index, is_within
from .forms import RenameForm, lock_wait
from .held import blockers, locks_around
from .renames import RenameError, RenameInterrupted, rename
from .templatetags.fs_tags import browse_url

LISTING_LIMIT = 500


def store_errors(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Render a 503 page naming the store when Elasticsearch or the lock store does not answer."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except (ApiError, TransportError, LockError) as e:
            context = {
                "error": f"{type(e).__name__}: {e}",
                "es_url": es_url(),
                "lock_store": get_backend().describe(),
                "path": ROOT,
            }
            return render(request, "fs/unavailable.html", context, status=503)

    return wrapper


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


@require_POST
@store_errors
def rename_view(request: HttpRequest) -> HttpResponse:
    """Rename a file or directory under lock_tree; say how it went with a message, back on the page viewed."""
    form = RenameForm(request.POST)
    try:
        viewing = clean_path(request.POST.get("next") or ROOT)
    except InvalidLockPath:
        viewing = ROOT
    if not form.is_valid():
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, f"Not renamed: {error}")
        return HttpResponseRedirect(browse_url(viewing))
    src, dst, timeout = form.cleaned_data["src"], form.cleaned_data["dst"], form.cleaned_data["timeout"]
    try:
        result = rename(fs_index(), src, dst, timeout=timeout)
    except LockTimeout:  # a LockUnavailable too: first
        messages.warning(
            request,
            f"Timed out: waited {timeout:g}s for the locks on {src} and {dst}, still held: "
            f"{blockers([src, dst])}. Nothing was changed.",
            extra_tags="timeout",
        )
    except LockUnavailable:
        messages.error(
            request,
            f"Conflict: {src} cannot be renamed now, another operation holds a lock on it or on {dst}: "
            f"{blockers([src, dst])}. Nothing was changed; try again when it is released.",
            extra_tags="conflict",
        )
    except RenameInterrupted as e:
        messages.error(
            request,
            f"{e}. Its locks keep both paths blocked; manage.py reap_locks finishes it once their lease runs out.",
        )
    except RenameError as e:
        messages.error(request, f"Not renamed: {e}")
    except LockError as e:
        messages.error(request, f"Not renamed: the lock store failed ({e}).")
    else:
        messages.success(
            request,
            f"Renamed {src} to {dst}: {result.moved} document(s) moved in {result.seconds:.2f}s "
            f"under fencing token {result.token}.",
            extra_tags="renamed",
        )
        if is_within(viewing, src):
            viewing = dst + viewing[len(src) :]
    return HttpResponseRedirect(browse_url(viewing))
