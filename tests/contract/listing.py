"""Listing held locks page by page with filters, as the admin does, on every backend."""

from __future__ import annotations

import socket

from django_esdlock import lock_tree
from django_esdlock.modes import Mode

from ..expiry import expire
from .lock import raw_grant


def keys(page) -> set[tuple[str, str, str]]:
    return {(h.node.namespace, h.node.key, h.mode.value) for h in page.holders}


class ListingContract:
    """Subclass with a ``lock_config`` fixture (``backend`` and ``peer`` build on it)."""

    def test_filters_select_holders_in_the_store(self, backend, peer):
        peer.acquire("file", scheme="tree", path="/clinton/projects/README.txt", namespace="fs")
        old = raw_grant(backend, "/old", Mode.X, ttl=30, namespace="other")
        expire(backend, old.request.holder_id)
        with lock_tree("/bill", shared=True, namespace="fs", backend=backend):
            fs = {
                ("fs", "/clinton", "IX"),
                ("fs", "/clinton/projects", "IX"),
                ("fs", "/clinton/projects/README.txt", "X"),
                ("fs", "/bill", "S"),
            }
            assert keys(backend.holders(namespace="fs")) == fs
            assert keys(backend.holders()) == fs | {("other", "/old", "X")}
            assert keys(backend.holders(mode=Mode.X)) == {
                ("fs", "/clinton/projects/README.txt", "X"),
                ("other", "/old", "X"),
            }
            assert keys(backend.holders(expired=True)) == {("other", "/old", "X")}
            assert keys(backend.holders(expired=False)) == fs
            assert keys(backend.holders(host=socket.gethostname(), namespace="fs")) == fs
            assert keys(backend.holders(host="no-such-host")) == set()
            assert keys(backend.holders(path_prefix="/clinton/pro")) == {
                ("fs", "/clinton/projects", "IX"),
                ("fs", "/clinton/projects/README.txt", "X"),
            }
            assert keys(backend.holders(namespace="fs", parent="")) == {("fs", "/clinton", "IX"), ("fs", "/bill", "S")}
            assert keys(backend.holders(namespace="fs", parent="/clinton")) == {("fs", "/clinton/projects", "IX")}

    def test_cursor_walks_every_node_once_in_order(self, backend):
        for i in range(7):
            raw_grant(backend, f"/p/n{i}", Mode.S, ttl=30)
        seen, cursor, pages = [], None, 0
        while True:
            page = backend.holders(path_prefix="/p/", limit=3, cursor=cursor)
            seen.extend(h.node.key for h in page.holders)
            pages += 1
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == [f"/p/n{i}" for i in range(7)]
        assert pages == 3
