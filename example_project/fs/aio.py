"""Renames for async views: ``renames.py``'s rename driven with awaits, on ``alock_tree`` and AsyncElasticsearch.

What to send, what to check and what an answer means are ``renames.py``'s
and ``documents.py``'s (``move_documents``, ``check_found``, ``walk_page``, …);
only the I/O differs. The file system is read and written through an
``AsyncElasticsearch`` client opened for the rename and closed after it: the
event loop that serves the view owns its connections, and none outlives it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

from elasticsearch import AsyncElasticsearch

from django_esdlock import AsyncLock, alock_tree
from django_esdlock.backends.base import BaseLockBackend
from django_esdlock.fencing import afenced_update_documents

from .documents import ROOT, Entry, at_search, clean_path, entry_at, parent_of, subtree_query, walk_page
from .renames import (
    FENCE_FIELD,
    NAMESPACE,
    RenameInterrupted,
    RenameResult,
    check_found,
    check_rename,
    lock_order,
    logger,
    move_documents,
    rename_intent,
    renaming_errors,
)


class AsyncFsIndex:
    """The reads and writes of a rename on the ``fs`` index ``name``, awaited (the index exists: the page showed it)."""

    def __init__(self, client: AsyncElasticsearch, name: str) -> None:
        self.client = client
        self.name = name

    async def refresh(self) -> None:
        await self.client.indices.refresh(index=self.name)

    async def at(self, path: str) -> Entry | None:
        if path == ROOT:
            return Entry(id="", path=ROOT, parent=ROOT, name="", kind="dir", size=0, token=0)
        return entry_at(await self.client.search(index=self.name, **at_search(path)))

    async def count(self, top: str) -> int:
        return int((await self.client.count(index=self.name, query=subtree_query(top)))["count"])

    async def walk(self, top: str, *, batch_size: int) -> AsyncIterator[list[Entry]]:
        cursor = None
        while True:
            page = await self.client.search(index=self.name, **walk_page(top, cursor, batch_size, ["path"], False))
            hits = page["hits"]["hits"]
            if not hits:
                return
            yield [Entry.from_hit(h) for h in hits]
            cursor = hits[-1]["sort"]

    async def move_batch(self, batch: list[Entry], src: str, dst: str, token: int) -> int:
        """The awaited :func:`~.renames.move_batch`."""
        with renaming_errors(token):
            documents = move_documents(batch, src, dst)
            writes = await afenced_update_documents(self.client, self.name, documents, token, field=FENCE_FIELD)
        return len(writes.updated)


async def amove_tree(index: AsyncFsIndex, src: str, dst: str, *, token: int, lock: AsyncLock, batch_size: int) -> int:
    """The awaited :func:`~.renames.move_tree`: batches in path order, each checked and checkpointed."""
    moved = 0
    async for batch in index.walk(src, batch_size=batch_size):
        lock.check()
        moved += await index.move_batch(batch, src, dst, token)
        await lock.checkpoint({"moved": moved, "after": batch[-1].path})
    await index.refresh()
    return moved


async def arename(
    es_url: str,
    index_name: str,
    src: str,
    dst: str,
    *,
    namespace: str = NAMESPACE,
    backend: BaseLockBackend | None = None,
    timeout: float | None = None,
    batch_size: int = 500,
) -> RenameResult:
    """Rename ``src`` to ``dst`` as :func:`~.renames.rename` does, awaiting the locks and the store.

    The same locks (``alock_tree`` on both paths, in :func:`lock_order`, one
    ``timeout`` overall), the same intent and checkpoints, the same checks
    and errors; a move stopped half-way abandons its locks for
    ``reap_locks`` to finish (RenameInterrupted). While it waits for a lock
    the task sleeps on the event loop: a worker serving other requests.
    """
    src, dst = clean_path(src), clean_path(dst)
    check_rename(src, dst)
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    intent = rename_intent(index_name, src, dst)
    async with AsyncElasticsearch(es_url, request_timeout=120) as client, contextlib.AsyncExitStack() as stack:
        index = AsyncFsIndex(client, index_name)
        locks: dict[str, AsyncLock] = {}
        for role, path in sorted((("src", src), ("dst", dst)), key=lambda item: lock_order(item[1])):
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            lock = alock_tree(path, namespace=namespace, timeout=wait, intent={**intent, "role": role}, backend=backend)
            locks[role] = await stack.enter_async_context(lock)
        await index.refresh()
        entry = await index.at(src)
        check_found(src, dst, entry, await index.at(dst), await index.at(parent_of(dst)), expect_id=None)
        assert entry is not None
        token = max(lock.token or 0 for lock in locks.values())
        try:
            # The first checkpoint says "validated, moving": recovery rolls forward only after it.
            await locks["src"].checkpoint({"moved": 0, "after": None})
            moved = await amove_tree(index, src, dst, token=token, lock=locks["src"], batch_size=batch_size)
            for lock in locks.values():
                lock.check()
        except BaseException as e:
            for lock in locks.values():
                lock.abandon()
            logger.warning("rename %s -> %s stopped half-way; reap_locks will finish it", src, dst)
            if isinstance(e, Exception):
                raise RenameInterrupted(f"the rename of {src} to {dst} stopped half-way: {e}") from e
            raise
    return RenameResult(src, dst, entry.kind, moved, token, time.monotonic() - started)
