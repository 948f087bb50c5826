"""The admin page of held locks, through Django's test client, against a real store."""

from __future__ import annotations

import datetime
import os
import threading
import time

import pytest
from django.contrib.admin.models import DELETION, LogEntry

from django_esdlock import LockError, LockLost, lock_tree
from django_esdlock.conf import load_backend
from django_esdlock.deadlock import cycles
from django_esdlock.modes import Mode
from django_esdlock.records import Kind, LockRequest, Node
from django_esdlock.signals import lock_force_released

from . import admin_support
from .admin_support import staff_user
from .contract import all_holders, raw_grant
from .expiry import expire
from .locked_tasks import IMMEDIATE_BACKEND
from .waiting_state import hold, owner, wait

pytestmark = pytest.mark.django_db

lock_config = admin_support.lock_config  # the shared fixtures, by name in this module
releaser = admin_support.releaser

LIST = "/admin/django_esdlock/heldlock/"
TREE = LIST + "tree/"
RELEASE = LIST + "release/"
REAP = LIST + "reap/"
WAITING = LIST + "waiting/"


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(staff_user(django_user_model, "viewer", "view_heldlock"))
    return client


def rows(response) -> list[tuple[str, str]]:
    return [(r["record"].node.key, r["record"].mode.value) for r in response.context["rows"]]


def test_anonymous_is_sent_to_login(client, lock_config):
    for url in (LIST, TREE, WAITING):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_staff_without_permission_is_forbidden(client, django_user_model, lock_config):
    client.force_login(staff_user(django_user_model, "nobody"))
    assert client.get(LIST).status_code == 403
    assert client.get(TREE).status_code == 403
    assert client.get(WAITING).status_code == 403
    assert client.post(RELEASE, {"holder": "x"}).status_code == 403


def test_list_shows_the_backend_and_another_process_lock(viewer, lock_config, peer):
    peer.acquire("file", scheme="tree", path="/clinton/projects/README.txt", namespace="fs")
    response = viewer.get(LIST)
    assert response.status_code == 200
    assert response.context["backend_name"] == load_backend(lock_config).describe()
    assert rows(response) == [("/clinton", "IX"), ("/clinton/projects", "IX"), ("/clinton/projects/README.txt", "X")]
    assert b"/clinton/projects/README.txt" in response.content
    assert b"Force release" not in response.content  # no delete permission, no action


def test_list_shows_a_semaphores_holders_of_its_limit_and_its_waiters(viewer, lock_config, backend):
    backend.marker_ttl = 30  # the marker outlives the test; no request tries again to renew it
    node = Node("jobs", Kind.SEMAPHORE, "reindex")
    for name in ("first", "second"):
        request = LockRequest(f"{name}-holds", owner(name), ((node, Mode.S),), 60, holder_limit=2)
        assert backend.acquire(request) is not None
    waiting = LockRequest("third-waits", owner("third"), ((node, Mode.S),), 60, ticket=time.time_ns(), holder_limit=2)
    assert backend.acquire(waiting) is None
    response = viewer.get(LIST)
    assert rows(response) == [("reindex", "S"), ("reindex", "S")]
    assert [row["semaphore"] for row in response.context["rows"]] == [{"held": 2, "limit": 2, "waiting": 1}] * 2
    assert "semaphore: 2/2 held" in response.content.decode() and b"1 waiting" in response.content
    page = viewer.get(WAITING)
    assert {(e.waiter, e.blocker) for e in page.context["graph"].edges} == {
        ("third-waits", "first-holds"),
        ("third-waits", "second-holds"),
    }


def test_each_filter(viewer, lock_config, peer, backend):
    peer.acquire("file", scheme="tree", path="/clinton/README.txt", namespace="fs")
    expire(backend, raw_grant(backend, "/old", Mode.S, ttl=30, namespace="other").request.holder_id)
    with lock_tree("/bill", shared=True, namespace="fs", backend=backend):
        assert rows(viewer.get(LIST, {"mode": "X"})) == [("/clinton/README.txt", "X")]
        assert rows(viewer.get(LIST, {"namespace": "other"})) == [("/old", "S")]
        assert rows(viewer.get(LIST, {"expired": "yes"})) == [("/old", "S")]
        assert ("/old", "S") not in rows(viewer.get(LIST, {"expired": "no"}))
        assert rows(viewer.get(LIST, {"host": "elsewhere"})) == []
        assert len(rows(viewer.get(LIST, {"host": peer_host()}))) == 4
        assert rows(viewer.get(LIST, {"q": "/clinton/R"})) == [("/clinton/README.txt", "X")]
        bad = viewer.get(LIST, {"mode": "Q"})
        assert bad.status_code == 200 and "Invalid filter" in bad.context["error"]


def peer_host() -> str:
    import socket

    return socket.gethostname()


def test_pages_follow_the_cursor(viewer, lock_config, backend, settings):
    for i in range(5):
        raw_grant(backend, f"/p{i}", Mode.S, ttl=30)
    from django_esdlock.admin import HeldLockAdmin

    original = HeldLockAdmin.list_per_page
    HeldLockAdmin.list_per_page = 2
    try:
        seen, url = [], LIST
        while url:
            response = viewer.get(url)
            seen.extend(key for key, _ in rows(response))
            url = response.context["next_url"] and LIST + response.context["next_url"]
        assert seen == [f"/p{i}" for i in range(5)]
    finally:
        HeldLockAdmin.list_per_page = original


def test_tree_view_shows_children_and_holders(viewer, lock_config, peer):
    peer.acquire("file", scheme="tree", path="/clinton/projects/README.txt", namespace="fs")
    top = viewer.get(TREE, {"namespace": "fs"})
    assert [key for key, _ in top.context["children"]] == ["/clinton"]
    inner = viewer.get(TREE, {"namespace": "fs", "path": "/clinton/projects"})
    assert [r["record"].mode.value for r in inner.context["node_rows"]] == ["IX"]
    assert [key for key, _ in inner.context["children"]] == ["/clinton/projects/README.txt"]
    assert [c["path"] for c in inner.context["crumbs"]] == ["/clinton"]


def test_force_release_needs_delete_permission(viewer, lock_config, peer):
    holder = peer.acquire("file", scheme="tree", path="/clinton", namespace="fs")["holder_id"]
    assert viewer.post(RELEASE, {"holder": holder}).status_code == 403
    assert viewer.get(RELEASE).status_code == 405  # a GET is refused before permissions are looked at


def test_force_release_confirms_then_releases_logs_and_signals(releaser, lock_config, peer, backend):
    holder = peer.acquire("file", scheme="tree", path="/clinton/README.txt", namespace="fs")["holder_id"]
    assert releaser.get(RELEASE).status_code == 405
    confirm = releaser.post(RELEASE, {"holder": holder})
    assert confirm.status_code == 200 and b"are you sure" in confirm.content.lower()
    assert len(all_holders(backend)) == 2  # nothing released before confirmation
    signalled = []
    lock_force_released.connect(receiver := lambda holder, user, **kw: signalled.append((holder.node.key, user)))
    try:
        response = releaser.post(RELEASE, {"holder": holder, "confirm": "yes"})
    finally:
        lock_force_released.disconnect(receiver)
    assert response.status_code == 302
    assert all_holders(backend) == []
    (entry,) = LogEntry.objects.filter(object_id=holder)
    assert entry.action_flag == DELETION and entry.user.username == "releaser"
    assert "/clinton/README.txt" in entry.object_repr
    assert [key for key, _ in signalled] == ["/clinton/README.txt"]
    with lock_tree("/clinton", namespace="fs", timeout=0, backend=backend):
        pass


def test_a_raising_force_release_receiver_changes_nothing(releaser, lock_config, peer, backend, caplog):
    holder = peer.acquire("file", scheme="tree", path="/clinton/README.txt", namespace="fs")["holder_id"]

    def receiver(**kwargs):
        raise RuntimeError("the audit service is down")

    lock_force_released.connect(receiver)
    try:
        response = releaser.post(RELEASE, {"holder": holder, "confirm": "yes"}, follow=True)
    finally:
        lock_force_released.disconnect(receiver)
    assert "Released 1 holder." in [str(m) for m in response.context["messages"]]
    assert all_holders(backend) == []
    (logged,) = [r for r in caplog.records if r.name == "django_esdlock" and "lock_force_released" in r.getMessage()]
    assert logged.exc_info[1].args == ("the audit service is down",)


def test_reap_now(releaser, lock_config, backend, settings):
    settings.TASKS = {"default": {"BACKEND": IMMEDIATE_BACKEND}}  # runs in the request (see test_admin_intents.py)
    expire(backend, raw_grant(backend, "/stale", Mode.X, ttl=30).request.holder_id)
    response = releaser.post(REAP, follow=True)
    assert all_holders(backend) == []
    assert [str(m) for m in response.context["messages"]] == [
        "Ran in this request (no task backend is configured). Removed 1 expired holder."
    ]


def test_unreachable_store_is_a_message_not_a_crash(viewer, settings):
    settings.LOCK_BACKEND = {
        "BACKEND": "django_esdlock.backends.elasticsearch.ElasticsearchLockBackend",
        "OPTIONS": {"hosts": ["http://127.0.0.1:9"], "index": "locks", "request_timeout": 1, "max_retries": 0},
    }
    for url in (LIST, TREE, WAITING):
        response = viewer.get(url)
        assert response.status_code == 200
        assert "cannot be read" in response.context["error"]
        assert b"127.0.0.1:9" in response.content


# --- the waiting page: the wait-for graph -------------------------------------------


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"{what} not met within {timeout:g}s"
        time.sleep(0.02)
    return found


def test_waiting_page_draws_a_deadlock_of_two_threads_and_the_release_that_breaks_it(releaser, lock_config, backend):
    """Two threads (two owners) each hold one path and wait for the other's: the page shows the cycle."""
    backend.deadlock_timeout = None  # nobody gives up: the cycle stands until an operator breaks it
    barrier = threading.Barrier(2, timeout=10)
    held: dict[str, str] = {}
    outcome: dict[str, str] = {}

    def member(mine: str, other: str) -> None:
        name = threading.current_thread().name
        try:
            with lock_tree(mine, namespace="fs", backend=backend) as lock:
                held[name] = lock.holder_id
                barrier.wait()
                with lock_tree(other, namespace="fs", timeout=10, backend=backend):
                    outcome[name] = "granted"
        except LockLost:
            outcome[name] = "granted, outer lock force-released"
        except (LockError, threading.BrokenBarrierError) as e:
            outcome[name] = type(e).__name__

    threads = [
        threading.Thread(target=member, args=("/alice", "/bob"), name="alice"),
        threading.Thread(target=member, args=("/bob", "/alice"), name="bob"),
    ]
    for thread in threads:
        thread.start()
    try:
        (cycle,) = wait_for(lambda: cycles(backend.wait_state()), what="a cycle in the store")
        response = releaser.get(LIST)
        assert WAITING.encode() in response.content  # the held-locks list links to the waiting page
        response = releaser.get(WAITING)
        assert response.status_code == 200 and response.context["error"] is None
        graph = response.context["graph"]
        assert {r.owner["thread_name"] for r in graph.requests} == {"alice", "bob"}
        assert {(e.waiter_owner, e.node.key, e.mode.value, e.blocker, e.queued) for e in graph.edges} == {
            (e.waiter_owner, e.node.key, "X", e.blocker, False) for e in cycle.edges
        }
        assert {e.blocker for e in graph.edges} == set(held.values())
        (shown,) = response.context["cycles"]
        assert shown["victim"].holder_id == cycle.victim.holder_id  # the same victim the requests pick
        html = response.content.decode()
        assert html.count('data-cycle="yes"') == 2 and "1 deadlock" in html
        assert html.count('class="esdlock-arrow-cycle"') == 2  # the drawing: two red arrows
        assert f'data-victim="{cycle.victim.holder_id}"' in html
        for name in ("alice", "bob"):
            assert f"pid {os.getpid()} {name}" in html
        # Breaking it from the admin: force-release the victim's outer lock; the other gets in.
        victim = cycle.victim.owner["thread_name"]
        releaser.post(RELEASE, {"holder": held[victim], "confirm": "yes"})
        for thread in threads:
            thread.join(timeout=15)
            assert not thread.is_alive()
    finally:
        barrier.abort()
        for thread in threads:
            thread.join(timeout=15)
    assert outcome[victim] == "granted, outer lock force-released"
    assert outcome[{"alice": "bob", "bob": "alice"}[victim]] == "granted"
    after = releaser.get(WAITING)
    assert after.context["graph"].requests == () and b"No request is waiting" in after.content


def test_waiting_page_shows_a_queue_without_a_cycle(viewer, lock_config, backend):
    backend.marker_ttl = 30  # the markers outlive the test; no request tries again to renew them
    hold(backend, "reader", "/q", Mode.S)
    now = time.time_ns()
    wait(backend, "writer", "/q", Mode.X, ticket=now - 2_000_000_000)
    wait(backend, "second", "/q", Mode.S, ticket=now)  # compatible with the reader, queued behind the writer
    before = datetime.datetime.now(datetime.UTC)
    response = viewer.get(WAITING)
    after = datetime.datetime.now(datetime.UTC)
    graph = response.context["graph"]
    assert [r.holder_id for r in graph.requests] == ["writer-waits", "second-waits"]  # oldest first
    assert {(e.waiter, e.blocker, e.blocker_mode.value, e.queued) for e in graph.edges} == {
        ("writer-waits", "reader-holds", "S", False),
        ("second-waits", "writer-waits", "X", True),
    }
    assert graph.cycles == ()
    html = response.content.decode()
    assert "no deadlock" in html and 'data-cycle="yes"' not in html and 'id="esdlock-cycles"' not in html
    (writer_row,) = [row for row in response.context["requests"] if row["request"].holder_id == "writer-waits"]
    # Waited: from the request's ticket to when the page was drawn (between our two readings of the clock).
    since = writer_row["since"]
    assert abs(since.timestamp() * 1e9 - (now - 2_000_000_000)) < 1e6
    assert (before - since).total_seconds() <= writer_row["waited"] <= (after - since).total_seconds()
    assert "itself waiting" in html  # the second request's blocker, the writer, is a waiting request
    # A namespace with nothing waiting shows nothing.
    other = viewer.get(WAITING, {"namespace": "other"})
    assert other.context["graph"].requests == () and b"in namespace other" in other.content


def test_waiting_page_of_a_store_that_cannot_list_waiters(viewer, settings, tmp_path):
    settings.LOCK_BACKEND = {
        "BACKEND": "tests.waiting_state.NoWaitStateBackend",
        "OPTIONS": {"url": f"sqlite:///{tmp_path}/locks.sqlite3"},
    }
    response = viewer.get(WAITING)
    assert response.status_code == 200
    assert "cannot list waiting requests" in response.context["error"]
    assert response.context["graph"] is None


def test_waiting_page_shows_the_oldest_requests_and_first_deadlocks_and_counts_the_rest(
    viewer, lock_config, backend, monkeypatch
):
    """A crowd on one lock and two deadlocks, on a page that shows 3 rows: the oldest 3, counts of the rest."""
    from django_esdlock.admin import HeldLockAdmin
    from django_esdlock.waiting import SHOWN

    assert HeldLockAdmin.waiting_rows == SHOWN == 100
    monkeypatch.setattr(HeldLockAdmin, "waiting_rows", 3)
    backend.marker_ttl = 60  # nobody renews these markers
    now = time.time_ns()
    hold(backend, "holder", "/crowd")
    crowd = [wait(backend, f"c{i}", "/crowd", ticket=now + i) for i in range(5)]
    for pair, (first, second) in enumerate((("alice", "bob"), ("carol", "dave"))):
        hold(backend, first, f"/{first}")
        hold(backend, second, f"/{second}")
        wait(backend, first, f"/{second}", ticket=now - 10_000_000_000 + pair, holds=True)
        wait(backend, second, f"/{first}", ticket=now - 5_000_000_000 + pair, holds=True)
    response = viewer.get(WAITING)
    assert response.status_code == 200 and response.context["error"] is None
    graph = response.context["graph"]
    assert len(graph.requests) == 9 and len(graph.cycles) == 2
    # The oldest three requests (the deadlocks' first ones); both deadlocks fit; a count of the rest.
    assert [row["request"].holder_id for row in response.context["requests"]] == [
        "alice-waits",
        "carol-waits",
        "bob-waits",
    ]
    assert len(response.context["cycles"]) == 2
    assert (response.context["more_requests"], response.context["more_cycles"]) == (6, 0)
    html = response.content.decode()
    assert "9 waiting requests" in html and "2 deadlocks" in html
    assert "Showing the 3 oldest waiting requests: 6 more waiting requests not shown." in html
    assert "… and 6 younger waiting requests, not shown." in html
    assert not any(f'data-request="{holder_id}"' in html for holder_id in crowd)
    # One row: the first deadlock only, and a count of the other.
    monkeypatch.setattr(HeldLockAdmin, "waiting_rows", 1)
    response = viewer.get(WAITING)
    assert len(response.context["requests"]) == 1 and len(response.context["cycles"]) == 1
    assert (response.context["more_requests"], response.context["more_cycles"]) == (8, 1)
    html = response.content.decode()
    assert "8 more waiting requests and 1 more deadlock not shown" in html
    assert html.count('class="esdlock-cycle"') == 1 and "… and 1 more deadlock." in html
    # Everything fits: nothing is counted as left out.
    monkeypatch.setattr(HeldLockAdmin, "waiting_rows", 9)
    response = viewer.get(WAITING)
    assert len(response.context["requests"]) == 9 and len(response.context["cycles"]) == 2
    assert (response.context["more_requests"], response.context["more_cycles"]) == (0, 0)
    assert 'id="esdlock-waiting-truncated"' not in response.content.decode()
