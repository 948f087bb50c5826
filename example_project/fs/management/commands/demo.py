"""manage.py demo: everything a new user needs to see the race and its fix, in one command."""

from __future__ import annotations

import argparse
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.test.utils import override_settings
from elasticsearch import ApiError, TransportError

from django_esdlock import get_backend
from django_esdlock.noida import NoidaUnavailable, local_elasticsearch

from ...documents import fs_index
from ...tasks import start_worker, stop_worker


@contextlib.contextmanager
def _exit_on_termination() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into a normal exit, so that the local noida-db is stopped too."""

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {signum: signal.signal(signum, leave) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Command(BaseCommand):
    help = (
        "Migrate, start a local noida-db when ELASTICSEARCH_URL is unset, seed a demo tree (first run), "
        "run the fs_race report, then serve the site with runserver and a task worker (db_worker) beside it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000", help="Where to serve (runserver's).")
        parser.add_argument("--no-serve", action="store_true", help="Do everything but run the server.")
        parser.add_argument("--files", type=int, default=3000, help="Files in the demo tree (default 3000).")
        parser.add_argument("--reseed", action="store_true", help="Seed the demo tree again even if it exists.")
        parser.add_argument("--race-files", type=int, default=1000, help="Files per race round (default 1000).")
        parser.add_argument("--race-rounds", type=int, default=3, help="Race rounds per variant (default 3).")
        parser.add_argument(
            "--race-tasks",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="Race the renames as tasks on two db_worker processes too (default: yes).",
        )
        parser.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            help="Where the local noida-db keeps its data (default .noida-db/ in the project).",
        )
        parser.add_argument(
            "--es-port", type=int, default=9200, help="Port for the local noida-db (default 9200, else a free one)."
        )

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"== {text}"))

    def handle(self, *args: Any, **options: Any) -> None:
        with contextlib.ExitStack() as stack:
            self.step("Django's tables (and the database lock store) in " + str(settings.DATABASES["default"]["NAME"]))
            call_command("migrate", interactive=False, verbosity=0)
            url = (getattr(settings, "ELASTICSEARCH_URL", "") or "").rstrip("/")
            if url:
                self.step(f"Elasticsearch at {url} (ELASTICSEARCH_URL)")
            else:
                data_dir = options["data_dir"] or Path(getattr(settings, "BASE_DIR", Path.cwd())) / ".noida-db"
                self.step(f"Starting a local noida-db (Elasticsearch API), data in {data_dir}")
                try:
                    url = stack.enter_context(local_elasticsearch(data_dir, port=options["es_port"]))
                except NoidaUnavailable as e:
                    raise CommandError(str(e)) from e
                stack.enter_context(override_settings(ELASTICSEARCH_URL=url))
                self.stdout.write(f"   listening on {url}")
            self.stdout.write(f"   locks: {get_backend().describe()}")
            index = fs_index()
            try:
                fresh = options["reseed"] or not index.exists() or index.count() == 0
            except (ApiError, TransportError) as e:
                raise CommandError(f"Elasticsearch at {url} does not answer: {e}") from e
            if fresh:
                self.step("Seeding the demo tree")
                call_command("fs_seed", files=options["files"], stdout=self.stdout, stderr=self.stderr)
            else:
                self.step(f"The demo tree is there: {index.count():,} documents in {index.name!r} (--reseed to redo)")
            self.step("The chapter's race, without and with locks")
            call_command(
                "fs_race",
                files=options["race_files"],
                rounds=options["race_rounds"],
                tasks=options["race_tasks"],
                stdout=self.stdout,
                stderr=self.stderr,
            )
            address = options["addrport"]
            site = f"http://{address}/"
            self.step("Ready")
            self.stdout.write(
                f"   Open {self.style.SUCCESS(site)} to browse, search and rename; the admin is at {site}admin/\n"
                f"   (python manage.py createsuperuser to log in).\n"
                f"   In another terminal, watch a slow rename hold its lock:\n"
                f"     ELASTICSEARCH_URL={url} .venv/bin/python manage.py fs_rename /clinton /bill --pause 0.5"
            )
            if options["no_serve"]:
                return
            stack.enter_context(_exit_on_termination())
            # Beside the site, the worker that runs its "Rename (task)" renames; stopped on the way out.
            worker = start_worker({"ELASTICSEARCH_URL": url})
            stack.callback(stop_worker, worker)
            self.stdout.write(
                f"   A task worker runs the renames of the Rename (task) buttons: db_worker, pid {worker.pid}."
            )
            call_command("runserver", address, use_reloader=False)
