"""manage.py fs_rename: rename a file or directory of the fs index under lock_tree."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from elasticsearch import ApiError, TransportError

from django_esdlock import LockError, LockUnavailable, get_backend
from django_esdlock.exceptions import InvalidLockPath

from ...documents import DIR, fs_index
from ...renames import RenameError, RenameInterrupted, rename
from .fs_seed import ProgressBar


def seconds(value: str) -> float:
    number = float(value)
    if not number >= 0:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Rename the file or directory SRC to DST. Both are locked with lock_tree (namespace 'fs') "
        "with an intent; a directory's documents move in batches stamped with the lock's fencing token, "
        "with a checkpoint after each, so reap_locks can finish a rename whose process died."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("src", help="The path to rename, e.g. /clinton")
        parser.add_argument("dst", help="Its new path, e.g. /bill")
        parser.add_argument(
            "--timeout",
            type=seconds,
            default=None,
            help="Seconds to wait for the locks (default: wait as long as it takes; 0: fail at once).",
        )
        parser.add_argument("--batch-size", type=int, default=500, help="Documents per bulk request (default 500).")
        parser.add_argument(
            "--pause",
            type=seconds,
            default=0.0,
            help="Sleep this long between batches: slow a rename down to watch its lock in the web page.",
        )
        parser.add_argument("--index", help="Index name (default settings.FS_INDEX).")

    def recovery_note(self) -> str:
        return (
            f"The rename's locks keep both paths blocked; after their lease ({get_backend().ttl:g}s) runs out, "
            "`manage.py reap_locks` finishes it."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        index = fs_index(options["index"])
        verbose = options["verbosity"] >= 1
        bar: ProgressBar | None = None
        if verbose:
            self.stdout.write(f"Locking {options['src']} and {options['dst']} (lock_tree, namespace 'fs')")

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if not verbose or total <= 1:
                return
            if bar is None:
                self.stdout.write(f"Moving {total:,} document(s) from {options['src']} to {options['dst']}")
                bar = ProgressBar(self.stdout, total, "documents")
            bar.update(done)

        try:
            result = rename(
                index,
                options["src"],
                options["dst"],
                timeout=options["timeout"],
                batch_size=max(1, options["batch_size"]),
                progress=progress,
                pause=options["pause"],
            )
        except LockUnavailable as e:  # LockTimeout included
            raise CommandError(f"{options['src']} or {options['dst']} is locked by another operation: {e}") from e
        except RenameInterrupted as e:
            raise CommandError(f"{e}. {self.recovery_note()}") from e
        except KeyboardInterrupt as e:
            raise CommandError(f"Interrupted. If the move had begun: {self.recovery_note()}") from e
        except (RenameError, InvalidLockPath) as e:
            raise CommandError(str(e)) from e
        except (LockError, ApiError, TransportError) as e:
            raise CommandError(f"not renamed, a store failed: {type(e).__name__}: {e}") from e
        if bar is not None:
            bar.finish()
        if verbose:
            kind = "directory" if result.kind == DIR else "file"
            self.stdout.write(
                self.style.SUCCESS(
                    f"Renamed {kind} {result.src} -> {result.dst}: {result.moved:,} document(s) moved "
                    f"in {result.seconds:.2f}s under fencing token {result.token}."
                )
            )
