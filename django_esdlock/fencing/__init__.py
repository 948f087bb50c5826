"""Fenced writes: the data's store refuses a holder whose lock was taken over (its token is older than the data's).

A lease cannot stop a holder that was paused past it from writing after a new
holder started; the store of the data can, by comparing fencing tokens. See
docs/topics/fencing.md. ``FenceField``, ``fenced_update`` and ``fenced_save``
are the ORM's; ``fenced_update_document(s)`` Elasticsearch's (the client is
the caller's: nothing here imports the elasticsearch package).
"""

from ..exceptions import StaleFence
from .documents import (
    FENCED_UPDATE_SCRIPT,
    FencedDocument,
    FencedWriteFailed,
    FencedWrites,
    afenced_update_document,
    afenced_update_documents,
    fenced_update_document,
    fenced_update_documents,
)
from .orm import FenceField, afenced_save, afenced_update, fence_field, fenced_save, fenced_update
from .tokens import fence_token

__all__ = [
    "FENCED_UPDATE_SCRIPT",
    "FenceField",
    "FencedDocument",
    "FencedWriteFailed",
    "FencedWrites",
    "StaleFence",
    "afenced_save",
    "afenced_update",
    "afenced_update_document",
    "afenced_update_documents",
    "fence_field",
    "fence_token",
    "fenced_save",
    "fenced_update",
    "fenced_update_document",
    "fenced_update_documents",
]
