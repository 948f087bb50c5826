"""Argument types the management commands share."""

from __future__ import annotations

from typing import Any


def positive(kind: type) -> Any:
    """An argparse type: a number of ``kind`` greater than 0 (its name shows in argparse's error)."""

    def parse(value: str) -> Any:
        number = kind(value)
        if not number > 0:
            raise ValueError(value)
        return number

    parse.__name__ = kind.__name__
    return parse
