"""Caps on what one lock request may carry: checked before anything is sent, named in the error."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from .exceptions import InvalidLockArgument

DEFAULT_MAX_INTENT_BYTES = 16 * 1024
DEFAULT_MAX_CHECKPOINT_BYTES = 16 * 1024
DEFAULT_MAX_IDS_PER_REQUEST = 1000


@dataclasses.dataclass(frozen=True)
class Limits:
    """The caps of one backend, from ``LOCK_BACKEND["MAX_INTENT_BYTES"]`` and its siblings.

    Sizes are the UTF-8 bytes of the value's compact JSON (what the stores
    keep). A request over a cap raises InvalidLockArgument before it is sent.
    """

    intent_bytes: int = DEFAULT_MAX_INTENT_BYTES
    checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES
    ids_per_request: int = DEFAULT_MAX_IDS_PER_REQUEST

    SETTINGS: ClassVar[dict[str, str]] = {
        "MAX_INTENT_BYTES": "intent_bytes",
        "MAX_CHECKPOINT_BYTES": "checkpoint_bytes",
        "MAX_IDS_PER_REQUEST": "ids_per_request",
    }
    """``LOCK_BACKEND`` key -> field."""

    def check_intent(self, intent: Mapping[str, Any] | None) -> None:
        _check_size(intent, "intent", self.intent_bytes, "MAX_INTENT_BYTES")

    def check_checkpoint(self, checkpoint: Mapping[str, Any] | None) -> None:
        _check_size(checkpoint, "checkpoint", self.checkpoint_bytes, "MAX_CHECKPOINT_BYTES")

    def check_ids(self, count: int) -> None:
        if count > self.ids_per_request:
            raise InvalidLockArgument(
                f"lock_documents got {count:,} ids, over the cap of {self.ids_per_request:,} ids per request "
                "(LOCK_BACKEND['MAX_IDS_PER_REQUEST']); lock fewer ids at a time"
            )


def json_size(value: Any) -> int:
    """Return the UTF-8 bytes of ``value``'s compact JSON."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _check_size(value: Mapping[str, Any] | None, what: str, cap: int, setting: str) -> None:
    if value is None:
        return
    size = json_size(value)
    if size > cap:
        raise InvalidLockArgument(
            f"{what} is {size:,} bytes of JSON, over the cap of {cap:,} bytes (LOCK_BACKEND[{setting!r}]); "
            f"keep a reference to the data in the {what}, not the data"
        )
