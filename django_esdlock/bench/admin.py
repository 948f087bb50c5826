"""The admin changelist of held locks over a store filled with many held records."""

from __future__ import annotations

import statistics
import time
from typing import Any

from django.test import RequestFactory, override_settings
from django.urls import reverse

from .common import Figure, value_at_most
from .kit import StoreKit

RENDERS = 5


class _Viewer:
    """A staff user with every permission and no row in a user table: the page is measured, not auth."""

    pk = id = None
    username = "bench"
    is_active = is_staff = is_superuser = is_authenticated = True
    is_anonymous = False

    def get_username(self) -> str:
        return self.username

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return True

    def has_perms(self, perms: Any, obj: Any = None) -> bool:
        return True

    def has_module_perms(self, module: str) -> bool:
        return True


def changelist(kit: StoreKit, count: int, say: Any) -> list[Figure]:
    """Render the held-locks changelist with ``count`` held records in the store, against its first page read.

    The page must come from the backend's first page (``list_per_page``
    holders and a cursor), never from loading every record: the note says
    so when it does not. Needs ``django.contrib.admin`` and its URLs.
    """
    from django.contrib import admin

    from ..held_lock import HeldLock

    say(f"{kit.name}: admin changelist over {count:,} held records")
    kit.fill("bench-admin", count, expired=False)
    model_admin = admin.site._registry[HeldLock]
    with override_settings(LOCK_BACKEND=kit.config):
        from ..conf import get_backend

        request = RequestFactory().get(reverse("admin:django_esdlock_heldlock_changelist"))
        request.user = _Viewer()

        def render() -> Any:
            response = model_admin.changelist_view(request)
            return response.render()

        response = render()  # warm: the page's backend connects
        renders = []
        for _ in range(RENDERS):
            started = time.perf_counter()
            response = render()
            renders.append(time.perf_counter() - started)
        backend = get_backend()
        reads = []
        for _ in range(RENDERS):
            started = time.perf_counter()
            backend.holders(limit=model_admin.list_per_page)
            reads.append(time.perf_counter() - started)
    rows = len(response.context_data["rows"])
    paged = rows == model_admin.list_per_page and response.context_data["next_url"] is not None
    error = response.context_data.get("error")
    note = error or ("" if paged else f"showed {rows} rows and no next page: not a first page of {count:,}")
    return [
        Figure(
            key=f"{kit.name}.admin_changelist",
            backend=kit.name,
            label=f"admin changelist, {count:,} held records",
            value=statistics.median(renders),
            unit="s",
            baseline_label=f"backend first page ({model_admin.list_per_page})",
            baseline=statistics.median(reads),
            goal=value_at_most(1.0, "< 1 s") if count >= 100_000 else None,
            note=note,
            extra={"rows": rows, "paged": paged, "status": response.status_code},
        )
    ]
