"""Imported once by the forkserver that forks lock_check's workers: Django is set up before any fork.

A worker then starts in milliseconds instead of importing Django anew, so a
killed worker is replaced at once. The server forks from a single thread
with no connection open; each worker opens its own.
"""

import contextlib
import os

if os.environ.get("DJANGO_SETTINGS_MODULE"):
    import django

    django.setup()
    from django_esdlock.checker import workload  # noqa: F401 - the worker's code
    from django_esdlock.conf import backend_config

    with contextlib.suppress(ImportError):  # the store's client, when installed
        __import__(backend_config()["BACKEND"].rpartition(".")[0])
    with contextlib.suppress(ImportError):
        import django_esdlock.backends.database
    with contextlib.suppress(ImportError):
        import django_esdlock.backends.elasticsearch.backend  # noqa: F401
