"""The example project's pages."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from django_esdlock import get_backend


def home(request: HttpRequest) -> HttpResponse:
    """Show which lock store is in use and the locks it holds now."""
    backend = get_backend()
    page = backend.holders(limit=100)
    return render(request, "home.html", {"backend": backend.describe(), "holders": page.holders})
