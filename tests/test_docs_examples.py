"""Every ```python block of the docs runs, as written, against SQLite; ```py blocks are fragments, shown only.

A block runs alone in a fresh namespace, in this suite's Django, with its
locks in a fresh SQLite file (``LOCK_BACKEND``), and must leave no lock held.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from django.test import override_settings
from markdown_it import MarkdownIt

from django_esdlock.conf import get_backend

from .dbstores import sqlite_store

DOCS = Path(__file__).resolve().parent.parent / "docs"
RUN = "python"
"""The info string of a block that runs; ``py`` (same highlighting) marks a fragment."""


def examples() -> list[tuple[str, str]]:
    """Return ``(page:line, source)`` of every block of the docs fenced with exactly ```python."""
    parser = MarkdownIt("commonmark")
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        if "_build" in page.parts:
            continue
        for token in parser.parse(page.read_text()):
            if token.type == "fence" and token.info.strip() == RUN:
                found.append((f"{page.relative_to(DOCS)}:{token.map[0] + 1}", token.content))
    return found


EXAMPLES = examples()


def test_the_docs_have_runnable_examples():
    # The test below must have something to run: a docs tree without a runnable example would pass it.
    pages = {where.split(":")[0] for where, _ in EXAMPLES}
    assert len(EXAMPLES) >= 5 and {"intro/quickstart.md", "ref/exceptions.md"} <= pages, EXAMPLES


@pytest.mark.parametrize("source", [source for _, source in EXAMPLES], ids=[where for where, _ in EXAMPLES])
def test_example_runs(source):
    with sqlite_store() as config, override_settings(LOCK_BACKEND=config):
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, "<docs example>", "exec"), {"__name__": "docs_example"})
        assert get_backend().holders().holders == [], "the example left a lock held"
