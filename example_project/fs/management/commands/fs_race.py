"""manage.py fs_race: reproduce the chapter's race without locks, then with lock_tree, and report."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_esdlock.conf import backend_config

from ...documents import es_url
from ...race import DEFAULT_VARIANTS, TITLES, VARIANTS, Round, run_race


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Race a mass rename of /clinton against a rename of /clinton/projects/elasticsearch/README.txt in two "
        "processes: without locks (blind writes, then version numbers), then with lock_tree. Each round runs "
        "on a scratch index; the report counts lost updates, version conflicts and lost documents."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--files", type=positive, default=2000, help="Files under /clinton (default 2000).")
        parser.add_argument("--rounds", type=positive, default=3, help="Rounds per variant (default 3).")
        parser.add_argument(
            "--variant",
            action="append",
            choices=VARIANTS,
            help="Only these variants (repeatable; default all but tasks).",
        )
        parser.add_argument(
            "--tasks",
            action="store_true",
            help="Add the column where both renames run as tasks on two db_worker processes (needs migrate).",
        )
        parser.add_argument("--json", action="store_true", help="Print every round's numbers as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options["verbosity"]

        def on_round(outcome: Round) -> None:
            if verbosity >= 2 and not options["json"]:
                self.stderr.write(
                    f"{TITLES[outcome.variant]}: lost {outcome.lost_updates}, conflicts {outcome.conflicts}, "
                    f"README at {outcome.readme}"
                )

        if verbosity >= 1 and not options["json"]:
            self.stdout.write("Racing two renames in two processes (this takes a few seconds)...")
        chosen = set(options["variant"] or DEFAULT_VARIANTS) | ({"tasks"} if options["tasks"] else set())
        report = run_race(
            es_url=es_url(),
            lock_config=backend_config(),
            files=options["files"],
            rounds=options["rounds"],
            variants=tuple(v for v in VARIANTS if v in chosen),
            on_round=on_round,
        )
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        elif verbosity >= 1:
            self.stdout.write(report.render())
