"""The ``fs`` index: one Elasticsearch document per file or directory, and the queries on it."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from elasticsearch import Elasticsearch, NotFoundError, helpers

from django_esdlock.paths import normalize_path

DEFAULT_ES_URL = "http://127.0.0.1:9200"

MAPPING: dict[str, Any] = {
    # Strict: a typo in a field name is an error, not a new field.
    "dynamic": "strict",
    "properties": {
        "path": {"type": "keyword"},
        "parent": {"type": "keyword"},
        "name": {"type": "keyword", "fields": {"text": {"type": "text"}}},
        "kind": {"type": "keyword"},
        "size": {"type": "long"},
        "content": {"type": "text"},
        # The fencing token of the lock under which the document was last written.
        "token": {"type": "long"},
    },
}

ROOT = "/"
FILE = "file"
DIR = "dir"


@dataclasses.dataclass(frozen=True)
class Entry:
    """A file or directory as stored: its id never changes, its path does on rename."""

    id: str
    path: str
    parent: str
    name: str
    kind: str
    size: int
    token: int
    content: str = ""
    seq_no: int | None = None
    primary_term: int | None = None

    @classmethod
    def from_hit(cls, hit: Mapping[str, Any]) -> Entry:
        source = hit["_source"]
        return cls(
            id=hit["_id"],
            path=source["path"],
            parent=source.get("parent", ROOT),
            name=source.get("name", ""),
            kind=source.get("kind", FILE),
            size=source.get("size", 0),
            token=source.get("token", 0),
            content=source.get("content", ""),
            seq_no=hit.get("_seq_no"),
            primary_term=hit.get("_primary_term"),
        )

    @property
    def is_dir(self) -> bool:
        return self.kind == DIR

    def source(self) -> dict[str, Any]:
        """Return the document body, as indexed."""
        return {
            "path": self.path,
            "parent": self.parent,
            "name": self.name,
            "kind": self.kind,
            "size": self.size,
            "content": self.content,
            "token": self.token,
        }


def parent_of(path: str) -> str:
    """Return the directory holding ``path``: ``"/"`` for a top-level entry."""
    return path.rsplit("/", 1)[0] or ROOT


def name_of(path: str) -> str:
    return path.rsplit("/", 1)[1]


def join(directory: str, name: str) -> str:
    return f"/{name}" if directory == ROOT else f"{directory}/{name}"


def clean_path(path: str) -> str:
    """Return ``path`` normalized as a lock path (absolute, NFC, no ``..``); ``"/"`` stays the root.

    Raise ValueError (``InvalidLockPath``) otherwise: file paths are lock
    paths, so they follow the same rules.
    """
    if path == ROOT:
        return ROOT
    return normalize_path(path.rstrip("/") if len(path) > 1 else path)


def is_within(path: str, top: str) -> bool:
    """Return True if ``path`` is ``top`` or below it."""
    return top == ROOT or path == top or path.startswith(top + "/")


# Highlight markers from Unicode's private use area, so the fragment can be
# HTML-escaped whole before they become <em> tags (a stray one in a file only
# adds emphasis). Not control characters: a real Elasticsearch drops those
# from highlight tags (noida-db kept them).
_MARK_START, _MARK_END = "\ue000", "\ue001"


def _highlighted(fragment: str) -> SafeString:
    """Return an Elasticsearch highlight fragment as safe HTML: escaped text, matches in <em>."""
    return mark_safe(escape(fragment).replace(_MARK_START, "<em>").replace(_MARK_END, "</em>"))


def subtree_query(top: str) -> dict[str, Any]:
    """Match ``top`` and every document below it (not ``/topx``)."""
    if top == ROOT:
        return {"match_all": {}}
    return {
        "bool": {
            "should": [{"term": {"path": top}}, {"prefix": {"path": top + "/"}}],
            "minimum_should_match": 1,
        }
    }


def at_search(path: str) -> dict[str, Any]:
    """Return the search arguments that find the entry at ``path`` (read back with :func:`entry_at`)."""
    return {"query": {"term": {"path": path}}, "size": 2, "seq_no_primary_term": True}


def entry_at(response: Mapping[str, Any]) -> Entry | None:
    found = response["hits"]["hits"]
    return Entry.from_hit(found[0]) if found else None


def walk_page(
    top: str, cursor: list[Any] | None, batch_size: int, fields: list[str] | None, versions: bool
) -> dict[str, Any]:
    """Return the search arguments of a page of :meth:`FsIndex.walk`: ``top``'s subtree by path, after ``cursor``."""
    body: dict[str, Any] = {
        "query": subtree_query(top),
        "sort": [{"path": "asc"}],
        "size": batch_size,
        "track_total_hits": False,
        "seq_no_primary_term": versions,
    }
    if fields is not None:
        body["source_includes"] = fields
    if cursor is not None:
        body["search_after"] = cursor
    return body


class FsIndex:
    """The file system index ``name`` on the cluster of ``client``; created on first use."""

    def __init__(self, client: Elasticsearch, name: str) -> None:
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"<FsIndex {self.name!r}>"

    # --- lifecycle ---------------------------------------------------------

    def exists(self) -> bool:
        return bool(self.client.indices.exists(index=self.name))

    def ensure(self) -> None:
        """Create the index with its strict mapping unless it exists (checked once per process)."""
        key = (id(self.client), self.name)
        if key in _ready:
            return
        if not self.exists():
            # 400 if another process created it meanwhile: fine, it has our mapping.
            self.client.options(ignore_status=400).indices.create(index=self.name, mappings=MAPPING)
        _ready.add(key)

    def delete(self) -> None:
        self.client.options(ignore_status=404).indices.delete(index=self.name)
        _ready.discard((id(self.client), self.name))

    def refresh(self) -> None:
        self.ensure()
        self.client.indices.refresh(index=self.name)

    def index_entries(
        self, entries: Iterable[Entry], *, chunk_size: int = 2000, progress: Callable[[int], None] | None = None
    ) -> int:
        """Bulk index ``entries``, calling ``progress`` with the running count after each chunk; return the count."""
        self.ensure()
        actions = ({"_index": self.name, "_id": e.id, "_source": e.source()} for e in entries)
        done = 0
        for ok, _ in helpers.streaming_bulk(self.client, actions, chunk_size=chunk_size, raise_on_error=True):
            done += ok
            if progress is not None and done % chunk_size == 0:
                progress(done)
        if progress is not None and done % chunk_size:
            progress(done)
        self.refresh()
        return done

    # --- reads -------------------------------------------------------------

    def get(self, doc_id: str) -> Entry | None:
        self.ensure()
        try:
            return Entry.from_hit(self.client.get(index=self.name, id=doc_id))
        except NotFoundError:
            return None

    def at(self, path: str) -> Entry | None:
        """Return the entry at ``path`` (searched, so refresh after a write you must see)."""
        if path == ROOT:
            return Entry(id="", path=ROOT, parent=ROOT, name="", kind=DIR, size=0, token=0)
        self.ensure()
        return entry_at(self.client.search(index=self.name, **at_search(path)))

    def children(self, directory: str, *, limit: int = 500) -> list[Entry]:
        """Return the entries directly in ``directory``: directories first, then by name."""
        self.ensure()
        hits = self.client.search(
            index=self.name,
            query={"term": {"parent": directory}},
            sort=[{"kind": "asc"}, {"name": "asc"}],
            size=limit,
            source_excludes=["content"],
        )
        return [Entry.from_hit(h) for h in hits["hits"]["hits"]]

    def count(self, top: str = ROOT) -> int:
        """Return how many entries are ``top`` or below it."""
        self.ensure()
        return int(self.client.count(index=self.name, query=subtree_query(top))["count"])

    def search(self, text: str, *, within: str = ROOT, limit: int = 50) -> tuple[int, list[tuple[Entry, SafeString]]]:
        """Full-text search of names and contents; return the hit count and (entry, snippet) pairs."""
        self.ensure()
        query: dict[str, Any] = {
            "bool": {
                "must": [{"multi_match": {"query": text, "fields": ["name.text^3", "content"]}}],
                "filter": [] if within == ROOT else [subtree_query(within)],
            }
        }
        response = self.client.search(
            index=self.name,
            query=query,
            size=limit,
            highlight={
                "pre_tags": [_MARK_START],
                "post_tags": [_MARK_END],
                "fields": {"content": {"fragment_size": 120, "number_of_fragments": 1}},
            },
            track_total_hits=True,
            source_excludes=["content"],
        )
        results = []
        for hit in response["hits"]["hits"]:
            fragments = hit.get("highlight", {}).get("content", [])
            results.append((Entry.from_hit(hit), _highlighted(" … ".join(fragments))))
        return int(response["hits"]["total"]["value"]), results

    def scan(self, top: str = ROOT, *, fields: list[str] | None = None) -> Iterator[Entry]:
        """Yield every entry of ``top``'s subtree exactly once, in no order (a scroll: for audits)."""
        self.ensure()
        body = {"query": subtree_query(top)}
        source: list[str] | bool = fields if fields is not None else True
        for hit in helpers.scan(self.client, index=self.name, query=body, _source=source, size=1000):
            yield Entry.from_hit(hit)

    def walk(
        self,
        top: str = ROOT,
        *,
        after: str | None = None,
        batch_size: int = 500,
        fields: list[str] | None = None,
        versions: bool = False,
    ) -> Iterator[list[Entry]]:
        """Yield the entries of ``top``'s subtree in path order, one batch at a time.

        Paging is by ``search_after`` on the path (unique per entry), so a
        batch moved out of the subtree meanwhile does not shift later pages;
        ``after`` resumes past a path.
        """
        self.ensure()
        cursor = [after] if after is not None else None
        while True:
            page = self.client.search(index=self.name, **walk_page(top, cursor, batch_size, fields, versions))
            hits = page["hits"]["hits"]
            if not hits:
                return
            yield [Entry.from_hit(h) for h in hits]
            cursor = hits[-1]["sort"]


_ready: set[tuple[int, str]] = set()
"""(client, index name) pairs known to exist, so that a page view does not ask again."""

_clients: dict[str, Elasticsearch] = {}
_clients_lock = threading.Lock()


def es_url() -> str:
    """Return the cluster the example uses: ``settings.ELASTICSEARCH_URL``, else the local default."""
    return (getattr(settings, "ELASTICSEARCH_URL", "") or DEFAULT_ES_URL).rstrip("/")


def client_for(url: str) -> Elasticsearch:
    """Return this process's client of ``url`` (one per URL, opened lazily)."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = Elasticsearch(url, request_timeout=120)
        return client


def fs_index(name: str | None = None) -> FsIndex:
    """Return the index ``name`` (default ``settings.FS_INDEX``, ``"fs"``) on the configured cluster."""
    return FsIndex(client_for(es_url()), name or getattr(settings, "FS_INDEX", "fs"))


@receiver(setting_changed)
def _forget_clients(*, setting: str, **kwargs: Any) -> None:
    if setting == "ELASTICSEARCH_URL":
        with _clients_lock:
            _clients.clear()
            _ready.clear()
