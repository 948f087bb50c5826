"""Finishes renames whose process died: ``manage.py reap_locks`` calls the handler below."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django_esdlock import Lock
from django_esdlock.records import HolderRecord, Kind, Node
from django_esdlock.recovery import recovery_handler

from .documents import fs_index
from .renames import claim_tree, move_tree

logger = logging.getLogger("example_project.fs")


def _held_by_the_rename(intent: Mapping[str, Any], lock: Lock, path: str) -> HolderRecord | None:
    """Return the X record of ``path`` if the same rename (dead, or being recovered) still holds it."""
    namespace = lock.targets[-1][0].namespace
    for record in lock.backend.node_holders(Node(namespace, Kind.TREE, path)):
        if record.mode.value == "X" and (record.intent or {}).get("rename") == intent["rename"]:
            return record
    return None


@recovery_handler("rename")
def finish_rename(*, intent: Mapping[str, Any], checkpoint: Mapping[str, Any] | None, lock: Lock) -> None:
    """Roll a dead process's rename forward: move what is still under ``src`` to ``dst``, then claim ``dst``.

    A rename holds two locks, on its source and its destination, and both
    carry the intent, so both subtrees stay blocked until recovered; the
    reaper calls this once for each, holding that one under a new fencing
    token. Whichever runs while the other subtree is still held by the rename
    (the dead holder, or a reaper doing the same idempotent work) finishes the
    move and raises the token of everything under ``dst`` to its own: after
    that, no document of the rename accepts the dead holder's token. Once the
    other side has been recovered and released, its recovery did the work,
    and what is now there may be someone else's: leave it alone.

    A rename that never checkpointed had not started moving: there is nothing
    to finish.
    """
    src, dst = intent["src"], intent["dst"]
    other = _held_by_the_rename(intent, lock, dst if intent.get("role") == "src" else src)
    if intent.get("role") == "dst":
        if other is None:
            return
        checkpoint = other.checkpoint  # the source's lock records the progress
    if checkpoint is None:
        logger.info("rename %s -> %s died before moving anything", src, dst)
        return
    index = fs_index(intent["index"])
    index.refresh()  # the dead process's last batch may not be searchable yet
    done = int(checkpoint.get("moved", 0))
    moved = move_tree(index, src, dst, token=lock.token, lock=lock, after=checkpoint.get("after"), moved_before=done)
    if index.count(src):
        # Something sorted before the checkpoint is still there: sweep from the start.
        moved += move_tree(index, src, dst, token=lock.token, lock=lock, moved_before=done + moved)
    if other is not None:
        claim_tree(index, dst, token=lock.token, lock=lock)
    logger.info(
        "finished rename %s -> %s under token %s: %d moved before the crash, %d now", src, dst, lock.token, done, moved
    )
