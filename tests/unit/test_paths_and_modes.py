"""The pure modules: path rules and the compatibility matrix, no store involved."""

from __future__ import annotations

import itertools

import pytest

from django_esdlock import InvalidLockPath
from django_esdlock.modes import Mode, compatible, conflicting, lock_type
from django_esdlock.paths import MAX_DEPTH, MAX_PATH_LENGTH, ancestors, normalize_namespace, normalize_path, parent
from django_esdlock.records import MAX_NODE_ID_BYTES, Kind, Node

MATRIX = {  # DESIGN.md §2, row = held, column = requested
    "IS": {"IS": True, "IX": True, "S": True, "X": False},
    "IX": {"IS": True, "IX": True, "S": False, "X": False},
    "S": {"IS": True, "IX": False, "S": True, "X": False},
    "X": {"IS": False, "IX": False, "S": False, "X": False},
}


@pytest.mark.parametrize(("held", "requested"), list(itertools.product(Mode, Mode)))
def test_matrix_matches_design(held, requested):
    assert compatible(held, requested) is MATRIX[held.value][requested.value]
    assert (held in conflicting(requested)) is not MATRIX[held.value][requested.value]


def test_matrix_is_symmetric():
    for a, b in itertools.product(Mode, Mode):
        assert compatible(a, b) == compatible(b, a)


def test_lock_type_view():
    assert lock_type(["IX", "IS"]) == "shared"
    assert lock_type(["X"]) == "exclusive"
    assert lock_type([]) is None


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("/clinton", "/clinton"),
        ("/clinton/projects/elasticsearch/README.txt", "/clinton/projects/elasticsearch/README.txt"),
        ("/cafe\u0301", "/caf\u00e9"),  # NFD becomes NFC: one node, however it was typed
        ("/ a /b c", "/ a /b c"),
        ("/" + "x" * (MAX_PATH_LENGTH - 1), "/" + "x" * (MAX_PATH_LENGTH - 1)),
    ],
)
def test_normalize_path_accepts(raw, normalized):
    assert normalize_path(raw) == normalized


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "relative/path",
        "/",
        "//a",
        "/a//b",
        "/a/",
        "/a/./b",
        "/a/../b",
        "/..",
        "/a\x00b",
        "/a\nb",
        "/a\x7fb",
        "/a\u200bb",  # zero-width space: invisible, so two paths would look alike
        "/" + "x" * MAX_PATH_LENGTH,
        "/a" * (MAX_DEPTH + 1),
        None,
        42,
        b"/bytes",
        ["/a"],
    ],
)
def test_normalize_path_refuses(bad):
    with pytest.raises(InvalidLockPath):
        normalize_path(bad)


def test_invalid_lock_path_is_a_value_error():
    with pytest.raises(ValueError):
        normalize_path("relative")


def test_ancestors_and_parent():
    assert ancestors("/clinton/projects/elasticsearch/README.txt") == [
        "/clinton",
        "/clinton/projects",
        "/clinton/projects/elasticsearch",
    ]
    assert ancestors("/clinton") == []
    assert parent("/clinton/projects") == "/clinton"
    assert parent("/clinton") is None


@pytest.mark.parametrize("bad", ["", "has space", "a/b", ".hidden", "-dash", "x" * 101, 5, None])
def test_namespace_refuses(bad):
    with pytest.raises(InvalidLockPath):
        normalize_namespace(bad)


def test_long_node_ids_are_hashed_within_the_limit():
    short = Node("fs", Kind.TREE, "/a/b")
    assert short.id == "tree:fs:/a/b"
    long = Node("fs", Kind.TREE, "/" + "\u00e9" * 1000)  # 2000 bytes of UTF-8
    assert long.id.startswith("sha256:") and len(long.id.encode()) <= MAX_NODE_ID_BYTES
    assert long.id != Node("fs", Kind.TREE, "/" + "\u00e9" * 999).id
    assert Node("fs", Kind.DOCUMENT, "/a/b").id != short.id
