"""Template helpers of the example's pages."""

from __future__ import annotations

from django import template
from django.urls import reverse

from ..documents import ROOT

register = template.Library()


@register.filter
def browse_url(path: str) -> str:
    """Return the URL of the page of the file or directory at ``path``."""
    if not path or path == ROOT:
        return reverse("fs:root")
    return reverse("fs:browse", args=[path.lstrip("/")])


@register.filter
def crumbs(path: str) -> list[tuple[str, str]]:
    """Return (name, path) for the root and every directory down to ``path``."""
    trail = [("/", ROOT)]
    if path and path != ROOT:
        parts = path.strip("/").split("/")
        trail += [(part, "/" + "/".join(parts[: i + 1])) for i, part in enumerate(parts)]
    return trail
