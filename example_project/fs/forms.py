"""The rename form of the example's pages."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from django_esdlock.exceptions import InvalidLockPath

from .documents import ROOT, clean_path, join, parent_of


def lock_wait() -> float:
    """Seconds a rename from the page may wait for its locks (``settings.FS_LOCK_WAIT``, default 5)."""
    return float(getattr(settings, "FS_LOCK_WAIT", 5))


class RenameForm(forms.Form):
    """Rename ``src`` to ``to``: a new name in the same directory, or an absolute path to move it to.

    Unless ``wait`` is ticked a lock held by someone else fails the rename at
    once (a conflict); ticked, the rename waits up to :func:`lock_wait`
    seconds (then times out).
    """

    src = forms.CharField(widget=forms.HiddenInput)
    to = forms.CharField(max_length=1024, label="New name or path")
    wait = forms.BooleanField(required=False, label="wait for locks")

    def clean_src(self) -> str:
        try:
            return clean_path(self.cleaned_data["src"])
        except InvalidLockPath as e:
            raise forms.ValidationError(str(e)) from e

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        src, to = data.get("src"), (data.get("to") or "").strip()
        if src is None or not to:
            return data
        if not to.startswith("/") and "/" in to:
            raise forms.ValidationError("A new name cannot contain '/'; give an absolute path to move it.")
        try:
            data["dst"] = clean_path(to if to.startswith("/") else join(parent_of(src), to))
        except InvalidLockPath as e:
            raise forms.ValidationError(str(e)) from e
        if data["dst"] == ROOT:
            raise forms.ValidationError("Nothing can be renamed to the root.")
        data["timeout"] = lock_wait() if data.get("wait") else 0
        return data
