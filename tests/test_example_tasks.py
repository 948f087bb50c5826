"""The example's renames as background tasks: the view locks and hands off, a real ``db_worker`` claims and moves."""

from __future__ import annotations

import concurrent.futures
import io
import os
import subprocess

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command

from django_esdlock import get_backend, lock_tree
from example_project.fs.tasks import rename_task, worker_command
from example_project.fs.tree import README

from .contract import all_holders
from .example_support import example_fs, worker_env

DIRECTORY = "/clinton/projects/elasticsearch"
pytestmark = pytest.mark.django_db(transaction=True)  # the worker process reads the committed task rows


@pytest.fixture
def fs(es_url):
    with example_fs(es_url) as fs:
        fs.seed(300)
        yield fs


def run_worker_batch(fs, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``db_worker --batch``: every queued task, then exit."""
    return subprocess.run(
        [*worker_command(), "--batch"],
        env={**os.environ, **worker_env(fs)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def test_a_rename_task_is_locked_at_once_and_finished_by_a_worker(fs, client):
    response = client.post("/rename-task/", {"src": DIRECTORY, "to": "es", "next": "/clinton/projects"})
    assert response.status_code == 302 and response["Location"].startswith("/tasks/")
    page = client.get(response["Location"])
    assert page.status_code == 200 and 'data-status="READY"' in page.content.decode()
    assert '<meta http-equiv="refresh"' in page.content.decode()
    # Queued: the rename's locks are held already (handed off by the view, not yet claimed).
    held = {(h.node.key, h.mode.value) for h in all_holders(get_backend())}
    assert {(DIRECTORY, "X"), ("/clinton/projects/es", "X")} <= held
    worker = run_worker_batch(fs)
    result = rename_task.get_result(response["Location"].strip("/").split("/")[-1])
    assert result.status == "SUCCESSFUL", (result.errors[-1].traceback if result.errors else "", worker.stderr[-2000:])
    assert result.return_value["moved"] > 1 and result.return_value["pid"] != os.getpid()
    done = client.get(response["Location"]).content.decode()
    assert 'data-status="SUCCESSFUL"' in done and "Renamed /clinton/projects/elasticsearch to" in done
    assert '<meta http-equiv="refresh"' not in done
    assert fs.index.count(DIRECTORY) == 0 and fs.index.at("/clinton/projects/es/README.txt") is not None
    assert all_holders(get_backend()) == []


def test_a_rename_task_that_cannot_lock_is_not_enqueued(fs, client):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # another thread: another owner than the view's
        held = pool.submit(lock_tree(README, namespace="fs").acquire).result(timeout=30)
    try:
        response = client.post("/rename-task/", {"src": DIRECTORY, "to": "es", "next": "/clinton/projects"})
        assert response.status_code == 302 and not response["Location"].startswith("/tasks/")
        (message,) = [str(m) for m in get_messages(response.wsgi_request)]
        assert message.startswith(f"Conflict: {DIRECTORY} cannot be renamed now")
    finally:
        held.release()
    from django_tasks_db.models import DBTaskResult

    assert DBTaskResult.objects.count() == 0
    assert client.get("/tasks/no-such-task/").status_code == 404
    assert all_holders(get_backend()) == []


def test_race_as_tasks_on_two_workers(fs):
    out = io.StringIO()
    call_command("fs_race", "--variant", "tasks", "--files", "150", "--rounds", "1", stdout=out)
    assert "lock_tree, as tasks" in out.getvalue()
    assert (
        "As tasks on two db_worker processes: both renames applied in 1 of 1 rounds, 0 lost, "
        "0 documents lost or duplicated." in out.getvalue()
    )
    assert "/bill/…/README.asciidoc" in out.getvalue()


def test_at_most_fs_max_renames_rename_tasks_move_at_once(fs, settings):
    """A rename task takes a slot of the ``renames`` semaphore first: with every slot taken, it does not start."""
    from django_esdlock import LockUnavailable
    from example_project.fs.tasks import rename_slot

    settings.FS_MAX_RENAMES = 1
    options = {"timeout": 0, "es_url": fs.es_url, "index": fs.index.name}
    with rename_slot() as slot, concurrent.futures.ThreadPoolExecutor(1) as another_worker:
        assert slot.limit == 1
        refused = another_worker.submit(rename_task.call, DIRECTORY, "/clinton/projects/es", **options)
        with pytest.raises(LockUnavailable, match="sem:renames"):
            refused.result(timeout=60)
        assert fs.index.count(DIRECTORY) > 0  # nothing moved
    done = rename_task.call(DIRECTORY, "/clinton/projects/es", **options)
    assert done["moved"] > 1 and fs.index.count(DIRECTORY) == 0
    assert all_holders(get_backend()) == []
