"""Lock modes of multiple-granularity locking and the one table of what conflicts."""

from __future__ import annotations

import enum


class Mode(enum.StrEnum):
    """A lock mode (Gray et al.): intention shared/exclusive, shared, exclusive."""

    IS = "IS"
    IX = "IX"
    S = "S"
    X = "X"


# The single source of truth: which held mode lets which requested mode in.
_COMPATIBLE: dict[Mode, frozenset[Mode]] = {
    Mode.IS: frozenset({Mode.IS, Mode.IX, Mode.S}),
    Mode.IX: frozenset({Mode.IS, Mode.IX}),
    Mode.S: frozenset({Mode.IS, Mode.S}),
    Mode.X: frozenset(),
}


def compatible(held: Mode | str, requested: Mode | str) -> bool:
    """Return True if a holder in ``held`` lets a request in ``requested`` in."""
    return Mode(requested) in _COMPATIBLE[Mode(held)]


def conflicting(requested: Mode | str) -> frozenset[Mode]:
    """Return the held modes that block a request in ``requested``."""
    requested = Mode(requested)
    return frozenset(held for held in Mode if not compatible(held, requested))


def is_grant(mode: Mode | str) -> bool:
    """Return True for the modes that receive a fencing token (S and X)."""
    return Mode(mode) in (Mode.S, Mode.X)


def lock_type(modes: list[Mode] | list[str]) -> str | None:
    """Return the chapter's ``lock_type`` view of a node's holders.

    The chapter knows "exclusive" (the file) and "shared" (its parents);
    an X holder makes a node exclusive, any other holder shared.
    """
    if not modes:
        return None
    return "exclusive" if Mode.X in {Mode(m) for m in modes} else "shared"
