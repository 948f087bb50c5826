"""Fenced writes to Elasticsearch documents: a Painless script refuses a holder older than the document's fence.

What to send and what an answer means are decided here once
(:func:`fenced_bulk_request`, :func:`read_fenced_bulk`); the blocking and the
async helpers only make the ``_bulk`` call. A document is judged and written
atomically on its shard (a scripted update reads and writes one version; a
concurrent write makes it retry, ``retry_on_conflict``). Elasticsearch has no
transaction across documents: in the bulk form each document is refused or
written on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ..exceptions import InvalidLockArgument, StaleFence
from .tokens import fence_token

# Guarantees, for one document, atomically on its shard: its fence (the field
# params.field, absent = 0) never goes back, and a write whose token is older
# than the fence changes nothing; so does one whose `expect` fields do not
# hold the expected values (a precondition, e.g. "still at the path I read").
# Both refusals set ctx.op = 'none' (no throw: DESIGN.md §5) and read back as
# `noop` with the stored fence, which tells them apart. Top-level fields of
# params.doc replace the stored ones. Every value comes through params; the
# same source every time, so the node compiles it once. Painless of
# Elasticsearch 7.0 to 9, no lambdas; dynamic (def) comparisons and keySet()
# loops only, which noida-db's interpreter runs too (it has no casts, no entrySet).
FENCED_UPDATE_SCRIPT = """
def stored = ctx._source[params.field];
if (stored != null && stored > params.token) {
  ctx.op = 'none';
} else {
  boolean matches = true;
  for (def key : params.expect.keySet()) {
    if (ctx._source[key] != params.expect[key]) {
      matches = false;
    }
  }
  if (matches) {
    for (def key : params.doc.keySet()) {
      ctx._source[key] = params.doc[key];
    }
    ctx._source[params.field] = params.token;
  } else {
    ctx.op = 'none';
  }
}
"""
"""The Painless source of every fenced document write: refuses (``noop``) an older token or an unmet ``expect``."""

RETRY_ON_CONFLICT = 10
"""A real node answers 409 to concurrent updates of one document: retried on the shard this many times."""

UPDATED, UNMATCHED, MISSING = "updated", "unmatched", "missing"
"""What became of one document: written; left alone, its ``expect`` not met; not there (and no ``upsert``)."""


@dataclasses.dataclass(frozen=True)
class FencedDocument:
    """One document to write fenced: ``doc``'s top-level fields, if the fields of ``expect`` hold those values."""

    id: str
    doc: Mapping[str, Any]
    expect: Mapping[str, Any] | None = None


@dataclasses.dataclass
class FencedWrites:
    """What a fenced bulk did, by document id."""

    updated: list[str] = dataclasses.field(default_factory=list)
    unmatched: list[str] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)


class FencedWriteFailed(RuntimeError):
    """Elasticsearch failed some fenced writes for another reason than a newer fence; ``errors``: id -> reason."""

    def __init__(self, message: str, errors: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.errors = dict(errors or {})


def _documents(documents: Iterable[FencedDocument | tuple[Any, ...]]) -> list[FencedDocument]:
    found = []
    for item in documents:
        document = item if isinstance(item, FencedDocument) else FencedDocument(*item)
        if not isinstance(document.id, str) or not document.id:
            raise InvalidLockArgument(f"a document id is a non-empty str, not {document.id!r}")
        for what in ("doc", "expect"):
            value = getattr(document, what)
            if value is not None and not isinstance(value, Mapping):
                raise InvalidLockArgument(f"{what} of document {document.id} must be a dict, not {value!r}")
        found.append(document)
    if not found:
        raise InvalidLockArgument("a fenced bulk needs at least one document")
    return found


def fenced_bulk_request(
    index: str, documents: list[FencedDocument], token: int, *, field: str = "fence", upsert: bool = False
) -> list[dict[str, Any]]:
    """Return the ``_bulk`` operations of one fenced scripted update per document.

    Each item reads back the stored fence, so that a ``noop`` can be told
    apart: refused as stale, or ``expect`` not met. With ``upsert`` a missing
    document is created by the script (the fence then starts at ``token``).
    """
    if not isinstance(field, str) or not field:
        raise InvalidLockArgument(f"the fence field is a non-empty str, not {field!r}")
    for document in documents:
        if field in document.doc or field in (document.expect or {}):
            raise InvalidLockArgument(f"{field!r} is the fence: the fenced write sets it to the token")
    operations: list[dict[str, Any]] = []
    for document in documents:
        header = {"_index": index, "_id": document.id, "retry_on_conflict": RETRY_ON_CONFLICT}
        operations.append({"update": {**header, "_source": {"includes": [field]}}})
        params = {"field": field, "token": token, "doc": dict(document.doc), "expect": dict(document.expect or {})}
        body: dict[str, Any] = {"script": {"source": FENCED_UPDATE_SCRIPT, "lang": "painless", "params": params}}
        if upsert:
            body.update(scripted_upsert=True, upsert={})
        operations.append(body)
    return operations


def read_fenced_bulk(response: Mapping[str, Any], token: int, *, field: str = "fence") -> FencedWrites:
    """Return what a fenced bulk did; raise StaleFence if a document was refused, FencedWriteFailed on an error.

    StaleFence comes first: a newer holder's writes are what the caller must
    hear of (the documents not refused were written all the same).
    """
    writes, refused, errors = FencedWrites(), {}, {}
    for item in response["items"]:
        body = item["update"]
        doc_id = str(body.get("_id"))
        result, error = body.get("result"), body.get("error")
        if result in ("updated", "created"):
            writes.updated.append(doc_id)
        elif result == "noop":
            stored = (body.get("get") or {}).get("_source", {}).get(field) or 0
            if stored > token:
                refused[doc_id] = stored
            else:
                writes.unmatched.append(doc_id)
        elif error and body.get("status") == 404 and error.get("type") == "document_missing_exception":
            writes.missing.append(doc_id)
        else:
            errors[doc_id] = str(error.get("reason", error)) if isinstance(error, Mapping) else str(body)
    if refused:
        first, newer = next(iter(refused.items())), max(refused.values())
        raise StaleFence(
            f"{len(refused)} document(s) carry a fencing token newer than {token} (e.g. {first[0]}: {first[1]}): "
            f"a newer holder of the lock wrote there; they were left alone",
            token=token,
            newer=newer,
        )
    if errors:
        first_id = next(iter(errors))
        raise FencedWriteFailed(f"{len(errors)} fenced write(s) failed, e.g. {first_id}: {errors[first_id]}", errors)
    return writes


def _request(
    index: str, documents: Any, lock_or_token: Any, field: str, namespace: str | None, upsert: bool, refresh: Any
) -> tuple[int, dict[str, Any]]:
    """Check the input, then the lock (last: a lock lost meanwhile is caught as late as possible); return the token
    and the ``bulk`` call's arguments."""
    if not isinstance(index, str) or not index:
        raise InvalidLockArgument(f"an index name is a non-empty str, not {index!r}")
    operations = fenced_bulk_request(index, _documents(documents), 0, field=field, upsert=upsert)
    token = fence_token(lock_or_token, namespace=namespace)
    for body in operations[1::2]:
        body["script"]["params"]["token"] = token
    return token, {"operations": operations, **({} if refresh is None else {"refresh": refresh})}


def _outcome(writes: FencedWrites) -> str:
    """What became of the one document of a single-document write."""
    return UPDATED if writes.updated else UNMATCHED if writes.unmatched else MISSING


def fenced_update_documents(
    client: Any,
    index: str,
    documents: Iterable[FencedDocument | tuple[Any, ...]],
    lock_or_token: Any,
    *,
    field: str = "fence",
    namespace: str | None = None,
    upsert: bool = False,
    refresh: Any = None,
) -> FencedWrites:
    """Write each of ``documents`` (:class:`FencedDocument` or ``(id, doc[, expect])``) fenced, in one ``_bulk``.

    A document whose ``field`` holds a newer token than ``lock_or_token``'s
    is left alone and :exc:`~django_esdlock.StaleFence` raised after the
    bulk (the others were written: Elasticsearch has no multi-document
    transaction). A Lock is checked first, and refused if ``namespace`` is
    given and it is another's. ``client`` is an ``elasticsearch.Elasticsearch``.
    """
    token, bulk = _request(index, documents, lock_or_token, field, namespace, upsert, refresh)
    return read_fenced_bulk(client.bulk(**bulk), token, field=field)


def fenced_update_document(
    client: Any,
    index: str,
    id: str,
    doc: Mapping[str, Any],
    lock_or_token: Any,
    *,
    field: str = "fence",
    namespace: str | None = None,
    expect: Mapping[str, Any] | None = None,
    upsert: bool = False,
    refresh: Any = None,
) -> str:
    """Write ``doc``'s fields into document ``id`` unless it carries a newer token; return what became of it.

    ``"updated"``; ``"unmatched"`` (``expect`` not met, nothing written);
    ``"missing"`` (no such document, and no ``upsert``). Raise
    :exc:`~django_esdlock.StaleFence` if the document's fence is newer.
    """
    writes = fenced_update_documents(
        client,
        index,
        [FencedDocument(id, doc, expect)],
        lock_or_token,
        field=field,
        namespace=namespace,
        upsert=upsert,
        refresh=refresh,
    )
    return _outcome(writes)


async def afenced_update_documents(
    client: Any,
    index: str,
    documents: Iterable[FencedDocument | tuple[Any, ...]],
    lock_or_token: Any,
    *,
    field: str = "fence",
    namespace: str | None = None,
    upsert: bool = False,
    refresh: Any = None,
) -> FencedWrites:
    """Async :func:`fenced_update_documents`, on an ``elasticsearch.AsyncElasticsearch`` client."""
    token, bulk = _request(index, documents, lock_or_token, field, namespace, upsert, refresh)
    return read_fenced_bulk(await client.bulk(**bulk), token, field=field)


async def afenced_update_document(
    client: Any,
    index: str,
    id: str,
    doc: Mapping[str, Any],
    lock_or_token: Any,
    *,
    field: str = "fence",
    namespace: str | None = None,
    expect: Mapping[str, Any] | None = None,
    upsert: bool = False,
    refresh: Any = None,
) -> str:
    """Async :func:`fenced_update_document`, on an ``elasticsearch.AsyncElasticsearch`` client."""
    writes = await afenced_update_documents(
        client,
        index,
        [FencedDocument(id, doc, expect)],
        lock_or_token,
        field=field,
        namespace=namespace,
        upsert=upsert,
        refresh=refresh,
    )
    return _outcome(writes)
