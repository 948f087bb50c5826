"""Helpers of the example project's tests: a fresh fs index and lock index per test, wired into the settings."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator

from django.test import override_settings

from django_esdlock.conf import load_backend
from example_project.fs.documents import FILE, FsIndex, client_for, subtree_query
from example_project.fs.tree import generate

from .stores import es_config


@dataclasses.dataclass
class ExampleFs:
    """The example's stores for one test: its own ``fs`` index and lock index on the test cluster."""

    es_url: str
    index: FsIndex
    lock_config: dict

    @property
    def lock_url(self) -> str:
        """The lock config as a ``LOCK_URL``, for a ``manage.py`` subprocess."""
        host = urllib.parse.urlsplit(self.es_url).netloc
        return f"elasticsearch://{host}/{self.lock_config['OPTIONS']['index']}?ttl={self.lock_config['TTL']:g}"

    def seed(self, files: int, **options) -> int:
        return self.index.index_entries(generate(files, **options))

    def files(self, top: str = "/") -> int:
        query = {"bool": {"filter": [subtree_query(top), {"term": {"kind": FILE}}]}}
        return int(self.index.client.count(index=self.index.name, query=query)["count"])

    def snapshot(self) -> dict[str, tuple[str, int]]:
        """Return every document as id -> (path, token)."""
        self.index.refresh()
        return {e.id: (e.path, e.token) for e in self.index.scan(fields=["path", "token"])}

    def duplicated_paths(self) -> list[str]:
        """Return the paths that more than one document has (read by a scroll: every document, once)."""
        self.index.refresh()
        counts = Counter(e.path for e in self.index.scan(fields=["path"]))
        return sorted(path for path, count in counts.items() if count > 1)


@contextlib.contextmanager
def example_fs(es_url: str, *, ttl: float = 30.0) -> Iterator[ExampleFs]:
    """Point the example's settings at a fresh fs index and lock index; delete both afterwards."""
    name = f"test-fs-{uuid.uuid4().hex[:12]}"
    lock_config = es_config(es_url, ttl=ttl)
    with override_settings(
        ELASTICSEARCH_URL=es_url,
        FS_INDEX=name,
        LOCK_BACKEND=lock_config,
        ROOT_URLCONF="example_project.urls",
        FS_LOCK_WAIT=1,
    ):
        fs = ExampleFs(es_url, FsIndex(client_for(es_url), name), lock_config)
        try:
            yield fs
        finally:
            fs.index.delete()
            backend = load_backend(lock_config)
            backend.delete_indices()
            backend.close()


def worker_env(fs: ExampleFs, **extra: str) -> dict[str, str]:
    """The environment of a ``manage.py db_worker`` on the test's stores and its task table (this test's database)."""
    from django.conf import settings
    from django.db import connection

    database = os.path.abspath(connection.settings_dict["NAME"])
    return {
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "ELASTICSEARCH_URL": fs.es_url,
        "FS_INDEX": fs.index.name,
        "LOCK_URL": fs.lock_url,
        "DATABASE_URL": f"sqlite:///{database}",
        "SECRET_KEY": settings.SECRET_KEY,  # hand-off tickets are signed with it
        **extra,
    }
