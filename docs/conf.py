"""Sphinx configuration of the django-esdlock documentation (``sphinx-build -W --keep-going docs docs/_build``)."""

import sys
from importlib import metadata
from pathlib import Path

import django
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).parent / "_ext")]

# Autodoc imports the app; its models and admin need Django's registry, not a store.
settings.configure(
    INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes", "django_esdlock"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()

project = "django-esdlock"
author = "The django-esdlock developers"
copyright = "2026, the django-esdlock developers"
release = metadata.version("django-esdlock")
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "pictures",
    "commandhelp",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Every cross-reference must resolve (-W makes an unresolved one fail the build), except to the
# libraries the docs do not ship an inventory of (no network at build time).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(django|elasticsearch|psycopg|asyncio|collections|typing|concurrent|datetime|threading)\..*"),
    (r"py:class", r"(Any|Callable|Iterator|Iterable|Mapping|Sequence|Awaitable|AsyncIterator|Self|T|P|R)"),
    (r"py:class", r"(int|float|str|bytes|bool|dict|list|tuple|set|object|type|None|BaseException|Exception)"),
    (r"py:class", r"(ValueError|RuntimeError|TimeoutError|ConnectionError|NoneType)"),
    # Types of the signatures that are the package's insides, not its API (records, type variables).
    (
        r"py:class",
        r"(Targets|Grant|BaseLockBackend|django_esdlock\.records\..*|django_esdlock\.tasks\.F|django_esdlock\.tickets\.Ticket)",
    ),
]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"

html_theme = "furo"
html_title = f"django-esdlock {release}"
html_static_path = ["_static"]
