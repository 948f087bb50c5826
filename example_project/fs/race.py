"""The chapter's race, for real: a mass rename of /clinton against a rename of its README.txt.

Two processes race on a fresh index each round. The mass renamer moves
/clinton to /bill; as soon as it has started, the second user renames
/clinton/projects/elasticsearch/README.txt to README.asciidoc. Three variants:

- ``blind``: no locks, plain writes from what each process read. The mass
  rename writes the README back from its stale read: the user's rename is lost.
- ``versioned``: no locks, writes conditional on the version read
  (``if_seq_no``). The mass rename fails with a version conflict half-way,
  leaving /clinton split in two.
- ``locked``: :func:`renames.rename` and :func:`renames.rename_document` under
  ``lock_tree``. One waits for the other; both renames apply, in token order.
- ``tasks`` (on request: it needs Django's database for the task queue): the
  same two renames as background tasks (``tasks.rename_task``,
  ``tasks.rename_document_task``) run by two ``db_worker`` processes; the
  README's is enqueued once the mass rename's worker holds its lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from elasticsearch import ConflictError

from django_esdlock import LockError
from django_esdlock.backends.base import BaseLockBackend
from django_esdlock.conf import load_backend
from django_esdlock.records import Kind, Node

from .documents import FsIndex, client_for, join, name_of, parent_of
from .renames import RenameError, rename, rename_document
from .tree import README, entry_id, generate

SPAWN = multiprocessing.get_context("spawn")

VARIANTS = ("blind", "versioned", "locked", "tasks")
DEFAULT_VARIANTS = ("blind", "versioned", "locked")
TITLES = {"blind": "no locks", "versioned": "no locks, versions", "locked": "lock_tree", "tasks": "lock_tree, as tasks"}
LOCKED = ("locked", "tasks")
TASK_TIMEOUT = 300.0
"""Seconds a race task may take from enqueue to its end."""
SRC, DST = "/clinton", "/bill"
NEW_NAME = "README.asciidoc"


# --- the two users, without locks (what the chapter warns about) ---------------


def naive_move(index: FsIndex, src: str, dst: str, *, versioned: bool, started: Callable[[], None]) -> dict[str, Any]:
    """Rename a directory the naive way: read every document first (scan), then write them back moved.

    With ``versioned`` each write is conditional on the version read, and the
    rename stops at the first version conflict, as the chapter says it fails.
    """
    snapshot = [entry for batch in index.walk(src, batch_size=1000, versions=versioned) for entry in batch]
    started()
    moved = conflicts = 0
    for i in range(0, len(snapshot), 250):
        operations: list[dict[str, Any]] = []
        for entry in snapshot[i : i + 250]:
            new_path = dst + entry.path[len(src) :]
            header: dict[str, Any] = {"_index": index.name, "_id": entry.id}
            if versioned:
                header.update(if_seq_no=entry.seq_no, if_primary_term=entry.primary_term)
            body = {**entry.source(), "path": new_path, "parent": parent_of(new_path), "name": name_of(new_path)}
            operations += [{"index": header}, body]
        for item in index.client.bulk(operations=operations)["items"]:
            status = item["index"]["status"]
            if status == 409:
                conflicts += 1
            elif status >= 300:
                raise RuntimeError(f"bulk write failed: {item['index'].get('error')}")
            else:
                moved += 1
        if conflicts:
            break
    index.refresh()
    return {"ok": conflicts == 0, "moved": moved, "conflicts": conflicts}


def naive_rename_document(index: FsIndex, doc_id: str, new_name: str, *, versioned: bool) -> dict[str, Any]:
    """Rename one document the naive way: read it, write it back renamed (conditionally with ``versioned``)."""
    entry = index.get(doc_id)
    assert entry is not None, doc_id
    new_path = join(parent_of(entry.path), new_name)
    conditions = {"if_seq_no": entry.seq_no, "if_primary_term": entry.primary_term} if versioned else {}
    try:
        index.client.index(
            index=index.name, id=doc_id, document={**entry.source(), "path": new_path, "name": new_name}, **conditions
        )
    except ConflictError:
        return {"ok": False, "moved": 0, "conflicts": 1}
    return {"ok": True, "moved": 1, "conflicts": 0}


# --- the worker processes ---------------------------------------------------------


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()


def _run_job(job: dict[str, Any], backend: BaseLockBackend, started: Callable[[], None]) -> dict[str, Any]:
    index = FsIndex(client_for(job["es_url"]), job["index"])
    variant, role = job["variant"], job["role"]
    if variant != "locked":
        versioned = variant == "versioned"
        if role == "mass":
            return naive_move(index, SRC, DST, versioned=versioned, started=started)
        return naive_rename_document(index, job["doc_id"], NEW_NAME, versioned=versioned)
    options = {"namespace": job["namespace"], "backend": backend, "timeout": 120}
    try:
        if role == "mass":
            result = rename(index, SRC, DST, progress=lambda done, total: started(), **options)
        else:
            result = rename_document(index, job["doc_id"], NEW_NAME, **options)
    except (LockError, RenameError) as e:
        return {"ok": False, "moved": 0, "conflicts": 0, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, "moved": result.moved, "conflicts": 0, "token": result.token}


def _say_once(conn: Connection, message: tuple[str, Any]) -> Callable[[], None]:
    """Return a function that sends ``message`` the first time it is called, and then nothing."""
    said = False

    def say() -> None:
        nonlocal said
        if not said:
            said = True
            conn.send(message)

    return say


def _serve(conn: Connection, lock_config: dict[str, Any]) -> None:
    _setup_django()
    backend = load_backend(lock_config)
    try:
        while True:
            job = conn.recv()
            if job is None:
                return
            try:
                result = _run_job(job, backend, started=_say_once(conn, ("started", None)))
                conn.send(("done", result))
            except Exception:  # noqa: BLE001 - reported to the parent, which fails the round
                conn.send(("error", traceback.format_exc()))
    finally:
        backend.close()


class _Worker:
    """A spawned process that runs race jobs sent through a pipe."""

    def __init__(self, lock_config: dict[str, Any]) -> None:
        self.conn, child = SPAWN.Pipe()
        self.process = SPAWN.Process(target=_serve, args=(child, lock_config), daemon=True)
        self.process.start()
        child.close()  # the worker's end is its alone now: its death reads as EOF at once

    def send(self, job: dict[str, Any]) -> None:
        self.conn.send(job)

    def receive(self, expected: str, timeout: float = 300) -> Any:
        try:
            if not self.conn.poll(timeout):
                raise TimeoutError(f"race worker sent nothing for {timeout:g}s")
            status, value = self.conn.recv()
        except EOFError:
            self.process.join(timeout=5)
            raise RuntimeError(f"race worker exited with {self.process.exitcode}") from None
        if status == "error":
            raise RuntimeError(f"race worker failed:\n{value}")
        if status != expected:
            raise RuntimeError(f"race worker said {status!r}, expected {expected!r}")
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


@contextlib.contextmanager
def _workers(lock_config: dict[str, Any]) -> Iterator[tuple[_Worker, _Worker]]:
    mass, user = _Worker(lock_config), _Worker(lock_config)
    try:
        yield mass, user
    finally:
        mass.close()
        user.close()


# --- rounds and their audit -----------------------------------------------------


@dataclasses.dataclass
class Round:
    """What one round did and what the index looked like afterwards."""

    variant: str
    mass: dict[str, Any]
    user: dict[str, Any]
    seeded: int
    total: int
    duplicates: int
    under_src: int
    under_dst: int
    readme: str

    @property
    def expected_readme(self) -> str:
        """Where the README belongs if every rename that reported success was applied."""
        top = DST if self.mass["ok"] else SRC
        name = NEW_NAME if self.user["ok"] else name_of(README)
        return f"{top}{README[len(SRC) : -len(name_of(README))]}{name}"

    @property
    def lost_updates(self) -> int:
        """Renames that reported success but are not in the README's final path."""
        lost = 0
        if self.user["ok"] and name_of(self.readme) != NEW_NAME:
            lost += 1
        if self.mass["ok"] and not self.readme.startswith(DST + "/"):
            lost += 1
        return lost

    @property
    def conflicts(self) -> int:
        return self.mass.get("conflicts", 0) + self.user.get("conflicts", 0)

    @property
    def documents_lost(self) -> int:
        return self.seeded - self.total

    @property
    def order(self) -> str | None:
        """For locked rounds: which rename went first, by fencing token."""
        if "token" not in self.mass or "token" not in self.user:
            return None
        return "mass first" if self.mass["token"] < self.user["token"] else "README first"

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "expected_readme": self.expected_readme,
            "lost_updates": self.lost_updates,
            "conflicts": self.conflicts,
            "documents_lost": self.documents_lost,
            "order": self.order,
        }


def audit(index: FsIndex, *, seeded: int, readme_id: str, variant: str, mass: dict, user: dict) -> Round:
    """Count what is in the index after a round: totals, duplicates, where /clinton and the README went."""
    index.refresh()
    paths = Counter(entry.path for entry in index.scan(fields=["path"]))
    readme = index.get(readme_id)
    return Round(
        variant=variant,
        mass=mass,
        user=user,
        seeded=seeded,
        total=paths.total(),
        duplicates=paths.total() - len(paths),
        under_src=index.count(SRC),
        under_dst=index.count(DST),
        readme=readme.path if readme else "(missing)",
    )


def _task_outcome(result: Any) -> dict[str, Any]:
    """A race job's outcome from a finished task's result."""
    if result.status != "SUCCESSFUL":
        error = result.errors[-1].exception_class_path if result.errors else str(result.status)
        return {"ok": False, "moved": 0, "conflicts": 0, "error": error}
    value = result.return_value
    return {"ok": True, "moved": value["moved"], "conflicts": 0, "token": value["token"], "pid": value["pid"]}


def play_tasks_round(
    *, es_url: str, index_name: str, readme_id: str, namespace: str, lock_config: dict[str, Any], workers: list
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Enqueue the mass rename; once its worker holds /clinton, the README's; return both outcomes."""
    from .tasks import UNFINISHED, rename_document_task, rename_task

    options = {"es_url": es_url, "index": index_name, "namespace": namespace, "lock_config": lock_config}
    options["timeout"] = 120
    backend = load_backend(lock_config)
    deadline = time.monotonic() + TASK_TIMEOUT

    def result_of(task: Any, result_id: str) -> Any:
        dead = [w.pid for w in workers if w.poll() is not None]
        if dead:
            raise RuntimeError(f"race task worker(s) {dead} exited")
        if time.monotonic() > deadline:
            raise TimeoutError(f"race task {result_id} did not finish in {TASK_TIMEOUT:g}s")
        return task.get_result(result_id)

    try:
        mass = rename_task.enqueue(SRC, DST, **options)
        src = Node(namespace, Kind.TREE, SRC)
        # "As soon as it has started": its worker holds /clinton and has checkpointed (validated, moving).
        while not any(h.checkpoint is not None for h in backend.node_holders(src)):
            if result_of(rename_task, mass.id).status not in UNFINISHED:
                break
            time.sleep(0.02)
        user = rename_document_task.enqueue(readme_id, NEW_NAME, **options)
        outcomes = []
        for task, result in ((rename_document_task, user), (rename_task, mass)):
            while (finished := result_of(task, result.id)).status in UNFINISHED:
                time.sleep(0.05)
            outcomes.append(_task_outcome(finished))
    finally:
        backend.close()
    user_outcome, mass_outcome = outcomes
    return mass_outcome, user_outcome


def play_round(
    variant: str,
    *,
    es_url: str,
    index_name: str,
    files: int,
    namespace: str,
    workers: tuple[_Worker, _Worker] | None,
    lock_config: dict[str, Any] | None = None,
    task_workers: list | None = None,
) -> Round:
    """Seed a fresh /clinton tree in ``index_name``, race the two renames, audit, drop the index."""
    index = FsIndex(client_for(es_url), index_name)
    index.delete()
    seeded = index.index_entries(generate(files, users=["clinton"]))
    readme_id = entry_id(README)
    job = {"variant": variant, "es_url": es_url, "index": index_name, "namespace": namespace}
    if variant == "tasks":
        assert lock_config is not None and task_workers is not None
        try:
            mass, user = play_tasks_round(
                es_url=es_url,
                index_name=index_name,
                readme_id=readme_id,
                namespace=namespace,
                lock_config=lock_config,
                workers=task_workers,
            )
            return audit(index, seeded=seeded, readme_id=readme_id, variant=variant, mass=mass, user=user)
        finally:
            index.delete()
    assert workers is not None
    mass_worker, user_worker = workers
    try:
        mass_worker.send({**job, "role": "mass"})
        mass_worker.receive("started")
        user_worker.send({**job, "role": "user", "doc_id": readme_id})
        user = user_worker.receive("done")
        mass = mass_worker.receive("done")
        return audit(index, seeded=seeded, readme_id=readme_id, variant=variant, mass=mass, user=user)
    finally:
        index.delete()


@dataclasses.dataclass
class RaceReport:
    files: int
    rounds: list[Round]
    seconds: float

    def of(self, variant: str) -> list[Round]:
        return [r for r in self.rounds if r.variant == variant]

    def summary(self, variant: str) -> dict[str, Any]:
        rounds = self.of(variant)
        return {
            "rounds": len(rounds),
            "mass_ok": sum(r.mass["ok"] for r in rounds),
            "user_ok": sum(r.user["ok"] for r in rounds),
            "lost_updates": sum(r.lost_updates for r in rounds),
            "conflicts": sum(r.conflicts for r in rounds),
            "left_under_src": sum(r.under_src for r in rounds),
            "documents_lost": sum(r.documents_lost for r in rounds),
            "duplicates": sum(r.duplicates for r in rounds),
            "lost_or_duplicated": sum(r.documents_lost + r.duplicates for r in rounds),
            "bad_rounds": sum(bool(r.lost_updates or r.conflicts or r.under_src) for r in rounds),
            "readme": rounds[-1].readme if rounds else None,
            "orders": sorted({r.order for r in rounds if r.order}),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "seconds": round(self.seconds, 2),
            "summary": {v: self.summary(v) for v in VARIANTS if self.of(v)},
            "rounds": [r.as_dict() for r in self.rounds],
        }

    def render(self) -> str:
        """Return the side-by-side report."""
        variants = [v for v in VARIANTS if self.of(v)]
        sums = {v: self.summary(v) for v in variants}
        n = {v: sums[v]["rounds"] for v in variants}

        def short(path: str | None) -> str:
            if not path or "/" not in path[1:]:
                return str(path)
            return f"/{path.split('/')[1]}/…/{name_of(path)}"

        rows = [
            ("", [TITLES[v] for v in variants]),
            ("", ["-" * 24 for _ in variants]),
            (f"mass rename {SRC} -> {DST}", [f"{sums[v]['mass_ok']}/{n[v]} done" for v in variants]),
            (f"{name_of(README)} -> {NEW_NAME}", [f"{sums[v]['user_ok']}/{n[v]} done" for v in variants]),
            ("lost updates", [str(sums[v]["lost_updates"]) for v in variants]),
            ("version-conflict failures", [str(sums[v]["conflicts"]) for v in variants]),
            (f"left under {SRC} (all rounds)", [str(sums[v]["left_under_src"]) for v in variants]),
            ("documents lost or duplicated", [str(sums[v]["lost_or_duplicated"]) for v in variants]),
            ("README ends at (last round)", [short(sums[v]["readme"]) for v in variants]),
            ("order (by fencing token)", [", ".join(sums[v]["orders"]) or "-" for v in variants]),
        ]
        lines = [
            f"The chapter's race: rename {SRC} -> {DST} ({self.files} files) while a second user renames",
            f"{README} -> {NEW_NAME}; two processes, {max(n.values())} round(s) per column.",
            "",
        ]
        lines += [f"{label:<33}" + "".join(f"{cell:<28}" for cell in cells).rstrip() for label, cells in rows]
        lines.append("")
        unlocked = [v for v in variants if v not in LOCKED]
        if unlocked:
            bad = sum(sums[v]["bad_rounds"] for v in unlocked)
            total = sum(n[v] for v in unlocked)
            lost = sum(sums[v]["lost_updates"] for v in unlocked)
            failed = sum(sums[v]["conflicts"] for v in unlocked)
            lines.append(
                f"Without locks: {bad} of {total} rounds went wrong ({lost} lost update(s), {failed} failed write(s))."
            )
        if "locked" in variants:
            s = sums["locked"]
            both = min(s["mass_ok"], s["user_ok"])
            lines.append(
                f"With lock_tree: both renames applied in {both} of {n['locked']} rounds, in a serial order; "
                f"{s['lost_updates']} lost, {s['lost_or_duplicated']} documents lost or duplicated."
            )
        if "tasks" in variants:
            s = sums["tasks"]
            both = min(s["mass_ok"], s["user_ok"])
            lines.append(
                f"As tasks on two db_worker processes: both renames applied in {both} of {n['tasks']} rounds, "
                f"{s['lost_updates']} lost, {s['lost_or_duplicated']} documents lost or duplicated."
            )
        lines.append(f"({self.seconds:.1f}s)")
        return "\n".join(lines)


def run_race(
    *,
    es_url: str,
    lock_config: dict[str, Any],
    files: int = 2000,
    rounds: int = 3,
    variants: tuple[str, ...] = DEFAULT_VARIANTS,
    index_prefix: str = "fs-race",
    on_round: Callable[[Round], None] | None = None,
) -> RaceReport:
    """Play ``rounds`` rounds of each variant with two worker processes; return the report.

    Each round uses its own scratch index (deleted after its audit) and the
    locks live in a namespace of their own, so the race never touches the
    site's index or its locks.
    """
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:8]
    namespace = f"fs-race-{run_id}"
    played: list[Round] = []
    with contextlib.ExitStack() as stack:
        workers = stack.enter_context(_workers(lock_config)) if set(variants) - {"tasks"} else None
        task_workers = None
        if "tasks" in variants:
            from .tasks import workers as start_task_workers

            task_workers = stack.enter_context(start_task_workers(2))
        for variant in variants:
            for number in range(rounds):
                outcome = play_round(
                    variant,
                    es_url=es_url,
                    index_name=f"{index_prefix}-{run_id}-{variant}-{number}",
                    files=files,
                    namespace=namespace,
                    workers=workers,
                    lock_config=lock_config,
                    task_workers=task_workers,
                )
                played.append(outcome)
                if on_round is not None:
                    on_round(outcome)
    return RaceReport(files=files, rounds=played, seconds=time.monotonic() - started)
