"""The example's pages, through Django's test client: browse, search, rename and the lock panel."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.test import Client

from example_project.fs.documents import Entry
from example_project.fs.tree import README

from .example_support import example_fs
from .peer import Peer


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


def rename(client: Client, src: str, to: str, *, viewing: str, wait: bool = False):
    data = {"src": src, "to": to, "next": viewing}
    if wait:
        data["wait"] = "on"
    return client.post("/rename/", data, follow=True)


def page_text(response) -> str:
    """The page's text (``HttpResponse.text`` is Django 5.1+)."""
    return response.content.decode()


def messages_of(response) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]


def test_browse_the_root_a_directory_and_a_file(fs, client):
    root = client.get("/")
    assert root.status_code == 200
    for home in ("clinton", "bill", "hillary"):
        assert f'data-path="/{home}"' in page_text(root)
    directory = client.get("/browse/clinton/projects/elasticsearch")
    assert directory.status_code == 200
    assert 'data-path="/clinton/projects/elasticsearch/README.txt"' in page_text(directory)
    assert "No lock is held here." in page_text(directory)
    file = client.get("/browse" + README)
    assert file.status_code == 200 and "elasticsearch" in page_text(file) and "fencing token 0" in page_text(file)
    assert client.get("/browse/clinton/nothing-here").status_code == 404
    assert client.get("/browse/clinton/../bill").status_code == 404


def test_search_finds_by_content_and_escapes_it(fs, client):
    evil = Entry("evil", "/bill/evil.txt", "/bill", "evil.txt", "file", 40, 0, "needle <script>alert(1)</script>")
    fs.index.index_entries([evil])
    response = client.get("/search/", {"q": "needle"})
    assert response.status_code == 200
    assert 'href="/browse/bill/evil.txt"' in page_text(response)
    assert "&lt;script&gt;" in page_text(response) and "<script>alert" not in page_text(response)
    assert "<em>needle</em>" in page_text(response)
    within = client.get("/search/", {"q": "needle", "in": "/clinton"})
    assert "evil.txt" not in page_text(within) and "0 matches" in page_text(within)


def test_rename_a_directory_and_follow_it(fs, client):
    response = rename(client, "/clinton/projects", "work", viewing="/clinton/projects/elasticsearch")
    assert response.redirect_chain[-1][0] == "/browse/clinton/work/elasticsearch"
    ((level, text),) = messages_of(response)
    assert level == "success" and text.startswith("Renamed /clinton/projects to /clinton/work:")
    assert 'data-path="/clinton/work/elasticsearch/README.txt"' in page_text(response)
    assert fs.index.count("/clinton/projects") == 0


def test_rename_needs_csrf_and_post(fs):
    strict = Client(enforce_csrf_checks=True)
    assert strict.post("/rename/", {"src": "/clinton", "to": "x", "next": "/"}).status_code == 403
    assert strict.get("/rename/").status_code == 405
    assert fs.index.at("/clinton") is not None


def test_rename_errors_are_messages(fs, client):
    response = rename(client, "/clinton", "bill", viewing="/")
    assert messages_of(response) == [("error", "Not renamed: /bill already exists")]
    response = rename(client, "/clinton", "a/b", viewing="/")
    assert "cannot contain '/'" in messages_of(response)[0][1]


def test_conflict_then_timeout_while_another_process_holds_a_lock_inside(fs, client, peer):
    assert "token" in peer.acquire("readme", scheme="tree", path=README, namespace="fs")
    pid = peer.pid()
    page = client.get("/browse/clinton/projects")
    assert f'data-path="{README}"' in page_text(page) and f"pid {pid}" in page_text(page)  # the lock panel
    assert "exclusive</strong> (X) on" in page_text(page)

    response = rename(client, "/clinton/projects/elasticsearch", "es", viewing="/clinton/projects")
    ((level, text),) = messages_of(response)
    assert level == "error" and text.startswith("Conflict: /clinton/projects/elasticsearch cannot be renamed now")
    assert f"exclusive lock on {README} held by pid {pid}" in text

    response = rename(client, "/clinton/projects/elasticsearch", "es", viewing="/clinton/projects", wait=True)
    ((level, text),) = messages_of(response)
    assert level == "warning" and text.startswith("Timed out: waited 1s")
    assert fs.index.at("/clinton/projects/es") is None

    peer.release("readme")
    response = rename(client, "/clinton/projects/elasticsearch", "es", viewing="/clinton/projects", wait=True)
    assert messages_of(response)[0][0] == "success"
    assert fs.index.get(fs.index.at("/clinton/projects/es/README.txt").id).path.endswith("/es/README.txt")


def test_the_page_says_when_elasticsearch_is_down(fs, client, settings):
    settings.ELASTICSEARCH_URL = "http://127.0.0.1:9"
    response = client.get("/")
    assert response.status_code == 503 and "http://127.0.0.1:9" in page_text(response)
