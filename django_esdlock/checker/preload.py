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
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import import_string

    from django_esdlock.checker import workload  # noqa: F401 - the worker's code
    from django_esdlock.conf import BACKENDS, backend_config

    for path in dict.fromkeys([backend_config()["BACKEND"], *BACKENDS]):
        with contextlib.suppress(ImportError, ImproperlyConfigured):  # a store's client that is not installed
            import_string(path)  # the store's class and its client
