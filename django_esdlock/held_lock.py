"""The unmanaged model behind the admin page of held locks: URL and permissions, no table."""

from __future__ import annotations

from django.db import models


class HeldLock(models.Model):
    """A holder of a lock node, as the active lock backend reports it.

    There is no table: the admin asks the backend for pages of holders. The
    model gives the page its URL, its ``view`` and ``delete`` (force release)
    permissions and the content type admin log entries point at.
    """

    class Meta:
        managed = False
        db_table = "esdlock_held_lock_view"
        default_permissions = ("view", "delete")
        verbose_name = "held lock"
        verbose_name_plural = "held locks"

    def __str__(self) -> str:
        return f"held lock {self.pk}"
