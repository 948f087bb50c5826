"""The example project's commands: fs_seed, fs_rename, fs_race and demo, run with call_command.

The demo as a user starts it (noida-db started, seeded, raced, served, stopped) is tests/test_demo_signals.py.
"""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from django.core.management import CommandError, call_command

from example_project.fs.documents import DIR, ROOT, parent_of
from example_project.fs.race import RaceReport, Round
from example_project.fs.renames import StaleToken, move_tree
from example_project.fs.tree import README, entry_id

from .example_support import example_fs
from .peer import Peer

README_NEW = "/clinton/projects/elasticsearch/README.asciidoc"


@pytest.fixture
def fs(es_url):
    with example_fs(es_url) as fs:
        yield fs


def run(*args, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def test_seed_builds_a_whole_tree_with_the_readme(fs):
    out = run("fs_seed", "--files", "400")
    assert "Seeding 400 files" in out and "100% 400/400 files" in out
    assert fs.files() == 400
    snapshot = fs.snapshot()
    paths = {path for path, _ in snapshot.values()}
    assert README in paths and len(paths) == len(snapshot)
    directories = {e.path for batch in fs.index.walk() for e in batch if e.kind == DIR}
    assert {parent_of(path) for path in paths} <= directories | {ROOT}  # no orphan
    assert f"Indexed {len(snapshot):,} documents (400 files, {len(snapshot) - 400:,} directories)" in out
    run("fs_seed", "--files", "400")
    assert fs.snapshot() == snapshot  # the same seed gives the same tree, and a seed replaces the index


def test_rename_a_file_then_a_directory(fs):
    fs.seed(300)
    before = fs.snapshot()
    out = run("fs_rename", README, README_NEW)
    assert f"Renamed file {README} -> {README_NEW}: 1 document(s) moved" in out
    file_token = fs.index.get(entry_id(README)).token
    assert file_token > 0

    clinton = [doc_id for doc_id, (path, _) in before.items() if path == "/clinton" or path.startswith("/clinton/")]
    out = run("fs_rename", "/clinton", "/bill-old")
    assert f"Renamed directory /clinton -> /bill-old: {len(clinton):,} document(s) moved" in out
    after = fs.snapshot()
    assert fs.index.count("/clinton") == 0 and fs.index.count("/bill-old") == len(clinton)
    assert after[entry_id(README)][0] == "/bill-old/projects/elasticsearch/README.asciidoc"
    tokens = {after[doc_id][1] for doc_id in clinton}
    assert len(tokens) == 1 and tokens.pop() > file_token  # one lock, one newer token on every moved document
    assert {doc_id: after[doc_id] for doc_id in after if doc_id not in clinton} == {
        doc_id: before[doc_id] for doc_id in before if doc_id not in clinton
    }
    assert fs.index.at("/bill-old").name == "bill-old" and fs.index.at("/bill-old").parent == ROOT


@pytest.mark.parametrize(
    ("src", "dst", "message"),
    [
        ("/nope", "/other", "/nope does not exist"),
        ("/clinton", "/bill", "/bill already exists"),
        ("/clinton", "/clinton/projects/x", "cannot move /clinton into itself"),
        ("/clinton/projects", "/clinton", "/clinton exists: it is a directory above /clinton/projects"),
        ("/clinton", "/nowhere/clinton", "there is no directory /nowhere"),
        (README, f"{README}/x", "cannot move"),
        ("/clinton", "/a/../b", "'..' segment"),
    ],
)
def test_rename_refuses_what_makes_no_sense(fs, src, dst, message):
    fs.seed(200)
    before = fs.snapshot()
    with pytest.raises(CommandError, match=message.replace(".", r"\.")):
        run("fs_rename", src, dst)
    assert fs.snapshot() == before


def test_rename_fails_at_once_while_another_process_holds_a_lock_inside(fs):
    fs.seed(200)
    before = fs.snapshot()
    peer = Peer(fs.lock_config)
    try:
        assert "token" in peer.acquire("file", scheme="tree", path=README, namespace="fs")
        with pytest.raises(CommandError, match="locked by another operation"):
            run("fs_rename", "/clinton", "/bill-old", "--timeout", "0")
        assert fs.snapshot() == before
        peer.release("file")
        assert "Renamed directory /clinton" in run("fs_rename", "/clinton", "/bill-old", "--timeout", "0")
    finally:
        peer.close()


def test_the_store_refuses_a_write_with_an_older_token(fs):
    fs.seed(100)
    moved = move_tree(fs.index, "/clinton", "/bill-new", token=10)
    assert moved == fs.index.count("/bill-new") > 0
    before = fs.snapshot()
    with pytest.raises(StaleToken, match="newer writes exist"):
        move_tree(fs.index, "/bill-new", "/late", token=9)  # a holder whose lease ran out, waking up
    assert fs.snapshot() == before
    assert move_tree(fs.index, "/bill-new", "/clinton", token=10) == moved  # the same token may write again


def test_race_report_numbers_and_text(fs):
    """The suite's one fs_race control: without locks the race goes wrong, with lock_tree never; both as text too.

    The demo's tests (here and tests/test_demo_signals.py) run fs_race's text mode inside the demo.
    """
    report = json.loads(run("fs_race", "--files", "300", "--rounds", "3", "--json"))
    summary = report["summary"]
    unlocked = [summary["blind"], summary["versioned"]]
    # Without locks the race goes wrong: an update lost or a rename failed half-way, at least once.
    assert sum(s["lost_updates"] + s["conflicts"] for s in unlocked) >= 1
    locked = summary["locked"]
    assert locked["rounds"] == locked["mass_ok"] == locked["user_ok"] == 3
    assert locked["lost_updates"] == locked["conflicts"] == locked["left_under_src"] == 0
    assert locked["lost_or_duplicated"] == 0
    for played in report["rounds"]:
        assert played["documents_lost"] == played["duplicates"] == 0, played
        if played["variant"] == "locked":
            assert played["readme"] == "/bill/projects/elasticsearch/README.asciidoc"
            assert played["under_dst"] == played["seeded"] and played["under_src"] == 0
            assert played["order"] in ("mass first", "README first")
    # The same race as the text report shows it.
    fields = [field.name for field in dataclasses.fields(Round)]
    rounds = [Round(**{name: played[name] for name in fields}) for played in report["rounds"]]
    text = RaceReport(report["files"], rounds, report["seconds"]).render()
    assert "no locks" in text and "no locks, versions" in text and "lock_tree" in text
    assert "With lock_tree: both renames applied in 3 of 3 rounds, in a serial order; 0 lost, 0 documents" in text


@pytest.mark.django_db(transaction=True)
def test_demo_keeps_an_existing_tree(fs):
    fs.seed(50)
    out = run("demo", "--no-serve", "--race-files", "100", "--race-rounds", "1", "--no-race-tasks")
    assert f"Elasticsearch at {fs.es_url}" in out and "The demo tree is there" in out and "Seeding" not in out
