"""Validation and normalization of lock paths, document ids, names and namespaces."""

from __future__ import annotations

import re
import unicodedata

from .exceptions import InvalidLockPath

MAX_PATH_LENGTH = 1024
"""Longest accepted path or id, in characters after NFC normalization."""

MAX_DEPTH = 64
"""Most segments a tree path may have; each is one node of the request."""

_NAMESPACE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}")
# Cc (controls, incl. NUL, DEL, C1), Cf (format: zero-width, bidi overrides),
# Cs (surrogates), Co and Cn (private and unassigned) never belong in a key.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidLockPath(f"{what} must be a str, not {type(value).__name__}: {value!r}")
    if not value:
        raise InvalidLockPath(f"{what} must not be empty")
    value = unicodedata.normalize("NFC", value)
    if len(value) > MAX_PATH_LENGTH:
        raise InvalidLockPath(f"{what} is {len(value)} characters long; the limit is {MAX_PATH_LENGTH}")
    for char in value:
        if unicodedata.category(char) in _FORBIDDEN_CATEGORIES:
            raise InvalidLockPath(f"{what} contains the control or unassigned character {char!r}: {value!r}")
    return value


def normalize_path(path: object) -> str:
    """Return ``path`` NFC-normalized, or raise InvalidLockPath.

    A path is absolute and ``/``-separated, with no empty, ``.`` or ``..``
    segment and no trailing slash; the root ``/`` is not a node.
    """
    path = _check_text(path, "lock path")
    if not path.startswith("/"):
        raise InvalidLockPath(f"lock path must be absolute (start with '/'): {path!r}")
    if path == "/":
        raise InvalidLockPath("the root '/' is not a lock node; lock a path below it or use global_lock()")
    segments = path[1:].split("/")
    if len(segments) > MAX_DEPTH:
        raise InvalidLockPath(f"lock path has {len(segments)} segments; the limit is {MAX_DEPTH}")
    for segment in segments:
        if segment == "":
            raise InvalidLockPath(f"lock path has an empty segment ('//' or a trailing '/'): {path!r}")
        if segment in (".", ".."):
            raise InvalidLockPath(f"lock path has a {segment!r} segment: {path!r}")
    return path


def ancestors(path: str) -> list[str]:
    """Return the proper ancestors of a normalized path, shortest first."""
    segments = path[1:].split("/")
    return ["/" + "/".join(segments[:i]) for i in range(1, len(segments))]


def parent(path: str) -> str | None:
    """Return the parent of a normalized path, or None at the top level."""
    head = path.rsplit("/", 1)[0]
    return head or None


def normalize_key(value: object, what: str = "document id") -> str:
    """Return a document id or lock name NFC-normalized, or raise InvalidLockPath."""
    return _check_text(value, what)


def normalize_namespace(namespace: object) -> str:
    """Return ``namespace`` if it is 1-100 of ``[A-Za-z0-9_.-]``, else raise InvalidLockPath."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise InvalidLockPath(
            f"namespace must be 1-100 characters of letters, digits, '_', '.' or '-' "
            f"and not start with '.' or '-': {namespace!r}"
        )
    return namespace
