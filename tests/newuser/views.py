"""The view a new user writes (copied into a fresh ``startproject`` by tests/test_release.py): a rename under a lock."""

import time

from django.http import HttpResponse

from django_esdlock import LockUnavailable, lock_tree


def rename(request):
    """Hold X on ``?path=`` for ``?hold=`` seconds; 409 when someone holds it (no wait: ``timeout=0``)."""
    try:
        with lock_tree(request.GET["path"], timeout=0) as lock:
            time.sleep(float(request.GET.get("hold", "0")))
            return HttpResponse(f"renamed under token {lock.token}")
    except LockUnavailable:
        return HttpResponse("busy", status=409)
