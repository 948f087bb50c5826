"""The example's async rename view (``/arename/``: alock_tree and AsyncElasticsearch) through Django's AsyncClient."""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.messages import get_messages
from django.test import AsyncClient, override_settings

from django_esdlock import get_backend
from django_esdlock.conf import load_backend
from django_esdlock.signals import lock_acquired, lock_released
from example_project.fs.tree import README

from .contract import all_holders
from .example_support import example_fs
from .peer import Peer
from .waiting_state import wait_for_waiters

DIRECTORY = "/clinton/projects/elasticsearch"
TIMEOUT = 60.0
"""Seconds a test's event loop may run in all."""


@pytest.fixture
def fs(es_url):
    with example_fs(es_url) as fs:
        fs.seed(300)
        yield fs


@pytest.fixture
def peer(fs):
    peer = Peer(fs.lock_config)
    yield peer
    peer.close()


def run(coroutine):
    """Run ``coroutine`` on a new event loop (bounded); close the lock backend's connections of that loop after."""

    async def main():
        try:
            return await asyncio.wait_for(coroutine, TIMEOUT)
        finally:
            await get_backend().aclose()

    return asyncio.run(main())


async def arename(client: AsyncClient, src: str, to: str, *, viewing: str, wait: bool = False):
    """Post the rename form to the async view and follow its redirect (by hand: Django 4.2's AsyncClient cannot)."""
    data = {"src": src, "to": to, "next": viewing, **({"wait": "on"} if wait else {})}
    response = await client.post("/arename/", data)
    assert response.status_code == 302, response.status_code
    page = await client.get(response["Location"])
    page.redirected_to = response["Location"]
    return page


def messages_of(response) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in get_messages(response.asgi_request)]


@pytest.fixture
def lock_events():
    """(event, rename id, role) of every lock taken and given back in this process, in order."""
    events: list[tuple[str, str, str]] = []

    def record(event):
        def receiver(*, lock, **kwargs):
            if lock.intent and lock.intent.get("op") == "rename":
                events.append((event, lock.intent["rename"], lock.intent["role"]))

        return receiver

    acquired, released = record("acquired"), record("released")
    lock_acquired.connect(acquired, weak=False)
    lock_released.connect(released, weak=False)
    yield events
    lock_acquired.disconnect(acquired)
    lock_released.disconnect(released)


@override_settings(FS_LOCK_WAIT=10)
def test_two_concurrent_renames_of_one_file_wait_in_turn_and_leave_no_lock(fs, peer, lock_events):
    assert "token" in peer.acquire("readme", scheme="tree", path=README, namespace="fs")

    async def main():
        client = AsyncClient()
        both = asyncio.gather(  # started as tasks at once
            arename(client, README, "first.txt", viewing=DIRECTORY, wait=True),
            arename(client, README, "second.txt", viewing=DIRECTORY, wait=True),
        )
        # Both requests wait on the peer's lock: their markers are in the store (the loop runs them meanwhile).
        await asyncio.to_thread(wait_for_waiters, watcher, 2, what="both renames waiting", timeout=TIMEOUT / 2)
        assert not both.done()
        await asyncio.to_thread(peer.release, "readme")
        return await both

    watcher = load_backend(fs.lock_config)
    try:
        responses = run(main())
    finally:
        watcher.close()
    outcomes = sorted(messages_of(response)[0] for response in responses)
    # One renamed the file; the other, let in after it, found it gone: their checks and moves never overlapped.
    (level, text), (other_level, other_text) = outcomes
    assert level == "error" and text == f"Not renamed: {README} does not exist"
    assert other_level == "success" and other_text.startswith(f"Renamed {README} to {DIRECTORY}/")
    assert other_text.endswith("(async view).")
    # Each took both of its locks (the source first: "README.txt" sorts before the new names) and gave them
    # back before the other took any: the one that failed found the source gone under its locks.
    assert [event for event, _, _ in lock_events] == ["acquired", "acquired", "released", "released"] * 2
    first, second = lock_events[0][1], lock_events[4][1]
    assert first != second and [rename for _, rename, _ in lock_events] == [first] * 4 + [second] * 4
    assert [role for _, _, role in lock_events] == ["src", "dst", "dst", "src"] * 2
    assert all_holders(get_backend()) == []
    fs.index.refresh()
    assert fs.index.at(README) is None


def test_a_lock_held_elsewhere_is_the_conflict_answer_then_the_rename_goes_through(fs, peer):
    assert "token" in peer.acquire("readme", scheme="tree", path=README, namespace="fs")
    pid = peer.pid()
    files, entries = fs.files(DIRECTORY), fs.index.count(DIRECTORY)

    async def conflict():
        client = AsyncClient()
        assert (await client.get("/arename/")).status_code == 405
        return await arename(client, DIRECTORY, "es", viewing="/clinton/projects")

    response = run(conflict())
    ((level, text),) = messages_of(response)
    assert level == "error" and text.startswith(f"Conflict: {DIRECTORY} cannot be renamed now")
    assert f"exclusive lock on {README} held by pid {pid}" in text
    assert fs.index.at("/clinton/projects/es") is None and fs.files(DIRECTORY) == files

    peer.release("readme")
    response = run(arename(AsyncClient(), DIRECTORY, "es", viewing=DIRECTORY))
    ((level, text),) = messages_of(response)
    assert level == "success" and text.startswith(f"Renamed {DIRECTORY} to /clinton/projects/es: ")
    assert f"{entries} document(s) moved" in text
    assert response.redirected_to == "/browse/clinton/projects/es"  # the page viewed, followed
    assert fs.files("/clinton/projects/es") == files and fs.index.count(DIRECTORY) == 0
    assert all_holders(get_backend()) == []
