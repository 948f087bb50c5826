"""Renames under ``lock_tree``: one document, or a directory moved in fenced batches."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from django_esdlock import Lock, lock_tree
from django_esdlock.backends.base import BaseLockBackend
from django_esdlock.fencing import FencedDocument, FencedWriteFailed, StaleFence, fenced_update_documents

from .documents import ROOT, Entry, FsIndex, clean_path, is_within, join, name_of, parent_of

logger = logging.getLogger("example_project.fs")

NAMESPACE = "fs"
"""The lock namespace of the example's file system."""

FENCE_FIELD = "token"
"""The field of an ``fs`` document holding the fencing token of the lock it was last written under.

Writes go through :func:`django_esdlock.fencing.fenced_update_documents`: a
write with an older token than the document's is refused (a stale holder
whose lease ran out cannot undo a newer holder's work), and a document no
longer at the path the mover read is left alone (``expect``: re-running a
batch is harmless).
"""


class RenameError(Exception):
    """A rename that cannot be done as asked."""


class NotFound(RenameError):
    """The source, or the directory to move into, does not exist."""


class AlreadyExists(RenameError):
    """Something already exists at the destination."""


class InvalidRename(RenameError):
    """The rename makes no sense: the root, a directory into itself, a bad name."""


class SourceMoved(RenameError):
    """The document expected at the source path is not there any more."""


class StaleToken(RenameError):
    """The store refused writes: the documents carry a newer fencing token than this lock's."""


class MoveFailed(RenameError):
    """The store failed a write of the move."""


class RenameInterrupted(RenameError):
    """The move stopped half-way; its locks, abandoned, wait for ``reap_locks`` to finish it."""


@dataclasses.dataclass(frozen=True)
class RenameResult:
    src: str
    dst: str
    kind: str
    moved: int
    token: int
    seconds: float


Progress = Callable[[int, int], None]
"""Called with (documents moved so far, documents to move)."""


def check_rename(src: str, dst: str) -> None:
    """Raise InvalidRename or AlreadyExists for a rename that no lock could make right."""
    if ROOT in (src, dst):
        raise InvalidRename("the root directory cannot be renamed, nor replaced")
    if src == dst:
        raise InvalidRename(f"{src} is already called that")
    if is_within(dst, src):
        raise InvalidRename(f"cannot move {src} into itself ({dst})")
    if is_within(src, dst):
        raise AlreadyExists(f"{dst} exists: it is a directory above {src}")


def check_found(
    src: str, dst: str, entry: Entry | None, existing: Entry | None, target: Entry | None, *, expect_id: str | None
) -> None:
    """Raise unless, as read under the locks, ``src`` is there (document ``expect_id`` if given), ``dst`` is not,
    and ``target`` (what is at ``dst``'s parent) is a directory: SourceMoved, NotFound or AlreadyExists.
    """
    if expect_id is not None and (entry is None or entry.id != expect_id):
        raise SourceMoved(f"document {expect_id} is no longer at {src}")
    if entry is None:
        raise NotFound(f"{src} does not exist")
    if existing is not None:
        raise AlreadyExists(f"{dst} already exists")
    if target is None or not target.is_dir:
        raise NotFound(f"there is no directory {parent_of(dst)} to move {name_of(src)} into")


def rename_intent(index_name: str, src: str, dst: str) -> dict[str, Any]:
    """Return the intent both locks of a rename carry (the ``role`` is added per lock): what recovery finishes."""
    return {"op": "rename", "rename": uuid.uuid4().hex, "index": index_name, "src": src, "dst": dst}


def lock_order(path: str) -> list[str]:
    """Sort key for taking several tree locks: by segments, so every process takes them in one order."""
    return path.split("/")


def move_documents(batch: list[Entry], src: str, dst: str) -> list[FencedDocument]:
    """Return the fenced writes that move ``batch`` (entries of ``src``'s subtree) under ``dst``.

    Each expects its document still at the path read: one moved meanwhile
    (an earlier run of this batch) is left alone.
    """
    documents = []
    for entry in batch:
        new_path = dst + entry.path[len(src) :]
        doc = {"path": new_path, "parent": parent_of(new_path), "name": name_of(new_path)}
        documents.append(FencedDocument(entry.id, doc, expect={"path": entry.path}))
    return documents


@contextlib.contextmanager
def renaming_errors(token: int) -> Iterator[None]:
    """Turn the fencing helpers' errors into the rename's: StaleToken, MoveFailed."""
    try:
        yield
    except StaleFence as e:
        raise StaleToken(
            f"the store refused writes with token {token}: newer writes exist (token {e.newer}); "
            "this lock is stale (lost, or the lock store was reset)"
        ) from e
    except FencedWriteFailed as e:
        raise MoveFailed(str(e)) from e


def move_batch(index: FsIndex, batch: list[Entry], src: str, dst: str, token: int) -> int:
    """Move ``batch`` under ``dst`` in one fenced ``_bulk``; return how many moved (StaleToken, MoveFailed)."""
    with renaming_errors(token):
        writes = fenced_update_documents(
            index.client, index.name, move_documents(batch, src, dst), token, field=FENCE_FIELD
        )
    return len(writes.updated)


def move_tree(
    index: FsIndex,
    src: str,
    dst: str,
    *,
    token: int,
    lock: Lock | None = None,
    after: str | None = None,
    moved_before: int = 0,
    batch_size: int = 500,
    progress: Callable[[int], None] | None = None,
    pause: float = 0.0,
) -> int:
    """Move ``src`` and everything below it to the same places under ``dst``; return how many moved.

    Entries go in path order, ``batch_size`` per ``_bulk``, each stamped with
    ``token`` by :func:`move_batch`. After each batch the ``lock`` (if
    given) is checked and its checkpoint set to ``{"moved", "after"}``, the
    last path done: a recovery resumes after it. Raise StaleToken if the store
    refused a write as older than the document's, MoveFailed on another error.
    """
    moved = 0
    for batch in index.walk(src, after=after, batch_size=batch_size, fields=["path"]):
        if lock is not None:
            lock.check()
        moved += move_batch(index, batch, src, dst, token)
        if lock is not None:
            lock.checkpoint({"moved": moved_before + moved, "after": batch[-1].path})
        if progress is not None:
            progress(moved)
        if pause:
            time.sleep(pause)
    index.refresh()
    return moved


def claim_tree(index: FsIndex, top: str, *, token: int, lock: Lock | None = None, batch_size: int = 500) -> int:
    """Stamp every entry of ``top``'s subtree with ``token`` (a fenced write of nothing else); return how many.

    Only for a subtree the caller's lock covers: a claimed document refuses
    every write with an older token, its previous holder's included. A
    document with a newer token than ``token`` means the caller's lock is
    stale itself: StaleToken.
    """
    claimed = 0
    for batch in index.walk(top, batch_size=batch_size, fields=["path"]):
        if lock is not None:
            lock.check()
        with renaming_errors(token):
            documents = [FencedDocument(entry.id, {}) for entry in batch]
            writes = fenced_update_documents(index.client, index.name, documents, token, field=FENCE_FIELD)
        claimed += len(writes.updated)
    index.refresh()
    return claimed


def rename(
    index: FsIndex,
    src: str,
    dst: str,
    *,
    namespace: str = NAMESPACE,
    backend: BaseLockBackend | None = None,
    timeout: float | None = None,
    ttl: float | None = None,
    batch_size: int = 500,
    progress: Progress | None = None,
    pause: float = 0.0,
    expect_id: str | None = None,
) -> RenameResult:
    """Rename the file or directory ``src`` to ``dst`` under tree locks on both; return what was done.

    Both paths are locked exclusively (ancestors in IX), in :func:`lock_order`,
    each waiting at most ``timeout`` overall (LockUnavailable / LockTimeout).
    Under the locks the source must exist (and be document ``expect_id``, else
    SourceMoved), the destination must not, and its parent must be a
    directory; nothing is written otherwise. Both locks carry the intent
    ``{"op": "rename", ...}``; once the move starts, checkpoints record its
    progress. If the move stops half-way (an error, a lost lock: raised as
    RenameInterrupted; or Ctrl-C) the locks are abandoned, not released: they
    keep the two subtrees blocked until their leases run out and
    ``reap_locks`` finishes the rename (``recovery.py``).
    """
    src, dst = clean_path(src), clean_path(dst)
    check_rename(src, dst)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        locks = take_rename_locks(
            stack, index.name, src, dst, namespace=namespace, backend=backend, timeout=timeout, ttl=ttl
        )
        kind, moved, token = move_under_locks(
            index, src, dst, locks, expect_id=expect_id, batch_size=batch_size, progress=progress, pause=pause
        )
    return RenameResult(src, dst, kind, moved, token, time.monotonic() - started)


def take_rename_locks(
    stack: contextlib.ExitStack,
    index_name: str,
    src: str,
    dst: str,
    *,
    namespace: str = NAMESPACE,
    backend: BaseLockBackend | None = None,
    timeout: float | None = None,
    ttl: float | None = None,
) -> dict[str, Lock]:
    """Take the two tree locks of a rename (``src``, ``dst`` roles), entered on ``stack``; return them by role.

    In :func:`lock_order`, waiting at most ``timeout`` overall, each with the
    rename's intent: what :func:`rename` takes, and what a view hands to a task.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    intent = rename_intent(index_name, src, dst)
    locks: dict[str, Lock] = {}
    for role, path in sorted((("src", src), ("dst", dst)), key=lambda item: lock_order(item[1])):
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        lock = lock_tree(
            path, namespace=namespace, timeout=wait, ttl=ttl, intent={**intent, "role": role}, backend=backend
        )
        locks[role] = stack.enter_context(lock)
    return locks


def move_under_locks(
    index: FsIndex,
    src: str,
    dst: str,
    locks: Mapping[str, Lock],
    *,
    expect_id: str | None = None,
    batch_size: int = 500,
    progress: Progress | None = None,
    pause: float = 0.0,
) -> tuple[str, int, int]:
    """Check and move, under the held ``locks`` of :func:`take_rename_locks`; return (kind, moved, token).

    Half-way failures abandon the locks, as :func:`rename` says.
    """
    index.refresh()
    entry = index.at(src)
    check_found(src, dst, entry, index.at(dst), index.at(parent_of(dst)), expect_id=expect_id)
    assert entry is not None
    total = index.count(src) if entry.is_dir else 1
    token = max(lock.token or 0 for lock in locks.values())
    try:
        # The first checkpoint says "validated, moving": recovery rolls forward only after it.
        locks["src"].checkpoint({"moved": 0, "after": None})
        if progress is not None:
            progress(0, total)
        moved = move_tree(
            index,
            src,
            dst,
            token=token,
            lock=locks["src"],
            batch_size=batch_size,
            progress=None if progress is None else (lambda done: progress(done, total)),
            pause=pause,
        )
        for lock in locks.values():
            lock.check()
    except BaseException as e:
        for lock in locks.values():
            lock.abandon()
        logger.warning("rename %s -> %s stopped half-way; reap_locks will finish it", src, dst)
        if isinstance(e, Exception):
            raise RenameInterrupted(f"the rename of {src} to {dst} stopped half-way: {e}") from e
        raise
    return entry.kind, moved, token


def rename_document(index: FsIndex, doc_id: str, new_name: str, *, attempts: int = 20, **options: Any) -> RenameResult:
    """Give document ``doc_id`` the name ``new_name`` in whatever directory it is in when locked.

    Read its path, lock it, and check it is still there: a concurrent
    directory rename may have moved it meanwhile, and then we follow it.
    """
    if not new_name or "/" in new_name or new_name in (".", ".."):
        raise InvalidRename(f"not a file name: {new_name!r}")
    for _ in range(attempts):
        entry = index.get(doc_id)
        if entry is None:
            raise NotFound(f"document {doc_id} does not exist")
        try:
            return rename(index, entry.path, join(parent_of(entry.path), new_name), expect_id=doc_id, **options)
        except SourceMoved:
            continue
    raise RenameError(f"document {doc_id} kept moving; gave up after {attempts} attempts")
