"""A Celery app on kombu's filesystem transport (no broker) with ``@locked`` tasks, for tests/test_tasks_celery.py.

The worker process gets its folder in ESDLOCK_CELERY_DIR and its lock store in
ESDLOCK_CELERY_LOCK_BACKEND (JSON); the test process calls :func:`configure`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid

from celery import Celery
from kombu.transport import filesystem
from kombu.utils.json import dumps

from django_esdlock import LockUnavailable, locked

QUEUE = "esdlock-tests"


class AtomicChannel(filesystem.Channel):
    """kombu's filesystem channel, writing each message whole before it appears.

    kombu creates the message file, then locks and writes it: a consumer that
    moves and reads it in between reads an empty message and the worker dies
    (JSONDecodeError; seen in CI). Here the message is written under a name the
    consumer skips and renamed into place (atomic on one file system).
    """

    def _put(self, queue, payload, **kwargs):
        staging = os.path.join(self.data_folder_out, f".staging-{os.getpid()}")
        os.makedirs(staging, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=staging, delete=False) as f:
            f.write(dumps(payload))
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        os.replace(f.name, os.path.join(self.data_folder_out, name))


class AtomicTransport(filesystem.Transport):
    Channel = AtomicChannel


app = Celery("esdlock_tests")


def configure(directory: str) -> None:
    """Point the app at the filesystem broker and result store under ``directory``."""
    messages, results, control = (os.path.join(directory, name) for name in ("messages", "results", "control"))
    for path in (messages, results, control):
        os.makedirs(path, exist_ok=True)
    app.conf.update(
        broker_url="filesystem://",
        broker_transport=f"{__name__}:AtomicTransport",
        broker_transport_options={
            "data_folder_in": messages,
            "data_folder_out": messages,
            "control_folder": control,  # fanout exchanges' bindings (default: ./control)
            "polling_interval": 0.05,
        },
        result_backend=f"file://{results}",
        task_default_queue=QUEUE,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,  # no fanout on this transport: no broadcast, no pidbox
        worker_send_task_events=False,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )


if "ESDLOCK_CELERY_DIR" in os.environ:  # the worker process
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django
    from django.test import override_settings

    django.setup()
    override_settings(LOCK_BACKEND=json.loads(os.environ["ESDLOCK_CELERY_LOCK_BACKEND"])).enable()
    configure(os.environ["ESDLOCK_CELERY_DIR"])


def _append(out: str, **entry) -> None:
    with open(out, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")


@app.task(name="esdlock.locked_append")
@locked(tree=lambda path: path, namespace="celery", timeout=0, lock_arg="lock")
def locked_append(path: str, out: str, lock=None) -> int:
    _append(out, token=lock.token)
    return lock.token


# The retry policy: a task that cannot get its lock raises LockUnavailable, and Celery retries it.
@app.task(
    name="esdlock.retried_append", autoretry_for=(LockUnavailable,), retry_kwargs={"countdown": 0.2}, max_retries=50
)
@locked(tree=lambda path: path, namespace="celery", timeout=0, lock_arg="lock")
def retried_append(path: str, out: str, lock=None) -> dict:
    """Return the token and how many times Celery retried the task before it got its lock."""
    from celery import current_task

    _append(out, token=lock.token)
    return {"token": lock.token, "retries": current_task.request.retries}


@app.task(name="esdlock.resumed_append")
@locked(tree=lambda path: path, namespace="celery", timeout=0, ticket="ticket", lock_arg="lock")
def resumed_append(path: str, out: str, ticket: str | None = None, lock=None) -> dict:
    _append(out, token=lock.token)
    return {"token": lock.token, "checkpoint": lock.last_checkpoint, "holder": lock.holder_id}


@app.task(name="esdlock.stuck_change")
@locked(
    tree=lambda path: path,
    namespace="celery",
    intent=lambda out: {"op": "test-append", "file": out},
    timeout=0,
    ttl=1,
    lock_arg="lock",
)
def stuck_change(path: str, out: str, started: str, lock=None) -> None:
    """Record progress, say so in ``started``, then hang until the test kills the worker."""
    lock.checkpoint({"done": 1})
    _append(started, token=lock.token, holder=lock.holder_id)
    time.sleep(120)
