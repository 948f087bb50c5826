"""manage.py fs_seed: fill the ``fs`` index with a realistic tree, bulk indexed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from elasticsearch import ApiError, TransportError

from ...documents import FILE, Entry, es_url, fs_index
from ...tree import README, generate


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class ProgressBar:
    """A one-line progress bar on a terminal; a line per tenth of the way elsewhere."""

    def __init__(self, stream: Any, total: int, what: str) -> None:
        self.stream = stream
        self.total = total
        self.what = what
        self.started = time.monotonic()
        self.tty = stream.isatty()
        self._tenths = -1

    def update(self, done: int) -> None:
        fraction = min(1.0, done / self.total) if self.total else 1.0
        text = (
            f"[{'#' * int(fraction * 30):<30}] {fraction:4.0%} {done:,}/{self.total:,} {self.what} "
            f"{time.monotonic() - self.started:5.1f}s"
        )
        if self.tty:
            self.stream.write("\r" + text, ending="")
            self.stream.flush()
        elif int(fraction * 10) > self._tenths:
            self._tenths = int(fraction * 10)
            self.stream.write(text)

    def finish(self) -> None:
        if self.tty:
            self.stream.write("")


class Command(BaseCommand):
    help = (
        "Replace the fs index with a realistic tree of FILES files (and their directories), "
        f"always containing {README}."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--files", type=positive, default=10_000, help="How many files (default 10000).")
        parser.add_argument("--index", help="Index name (default settings.FS_INDEX).")
        parser.add_argument("--seed", type=int, default=1992, help="Random seed: the same seed gives the same tree.")

    def handle(self, *args: Any, **options: Any) -> None:
        index = fs_index(options["index"])
        files = options["files"]
        quiet = options["verbosity"] < 1
        if not quiet:
            self.stdout.write(f"Seeding {files:,} files into index {index.name!r} at {es_url()}")
        bar = ProgressBar(self.stdout, files, "files")
        made = 0

        def counted(entries: Iterator[Entry]) -> Iterator[Entry]:
            nonlocal made
            for entry in entries:
                made += entry.kind == FILE
                yield entry

        started = time.monotonic()
        try:
            index.delete()
            indexed = index.index_entries(
                counted(generate(files, seed=options["seed"])),
                progress=None if quiet else lambda _: bar.update(made),
            )
        except (ApiError, TransportError) as e:
            raise CommandError(f"indexing into {es_url()} failed: {e}") from e
        if not quiet:
            bar.finish()
            self.stdout.write(
                self.style.SUCCESS(
                    f"Indexed {indexed:,} documents ({made:,} files, {indexed - made:,} directories) "
                    f"in {time.monotonic() - started:.1f}s."
                )
            )
