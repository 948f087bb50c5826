"""A deterministic, realistic-looking file tree to seed the ``fs`` index with."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence

from .documents import DIR, FILE, ROOT, Entry, name_of, parent_of

README = "/clinton/projects/elasticsearch/README.txt"
"""The file the chapter's second user renames."""

USERS: dict[str, int] = {"clinton": 6, "bill": 2, "hillary": 2, "chelsea": 1, "socks": 1}
"""Top-level home directories and their share of the files: /clinton is the big one."""

PROJECTS = [
    "elasticsearch",
    "kibana",
    "logstash",
    "lucene",
    "django",
    "website",
    "thesis",
    "budget",
    "garden-planner",
    "recipes",
    "tax-returns",
    "campaign",
]
PACKAGES = ["core", "index", "search", "cluster", "transport", "util", "http", "query", "analysis", "lock"]
MODULES = ["engine", "service", "client", "shard", "mapper", "parser", "codec", "store", "router", "cache"]
TOPICS = ["letters", "speeches", "reports", "minutes", "contracts", "notes", "invoices", "travel", "health", "school"]
MAIL_FOLDERS = ["inbox", "sent", "archive", "drafts", "lists"]
MONTHS = ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12"]
_VOCABULARY = (
    "the index shard replica mapping analyzer token document query filter cluster node lock tree file "
    "directory rename version conflict update search score lucene segment merge refresh flush translog "
    "budget meeting draft report garden tomato summer holiday family photo dinner recipe letter speech "
    "campaign vote policy health school travel invoice contract tax return review plan deadline notes"
)
WORDS = _VOCABULARY.split()


def entry_id(path: str) -> str:
    """Return a stable id derived from the seeded path; ids never change on rename."""
    return hashlib.sha1(path.encode()).hexdigest()[:20]


def _text(rng: random.Random, words: int, *, topic: str = "") -> str:
    chosen = [rng.choice(WORDS) for _ in range(words)]
    if topic:
        chosen[rng.randrange(len(chosen))] = topic
    sentences, step = [], 12
    for i in range(0, len(chosen), step):
        sentence = " ".join(chosen[i : i + step])
        sentences.append(sentence[:1].upper() + sentence[1:] + ".")
    return " ".join(sentences)


def _readme(project: str, rng: random.Random) -> str:
    return f"{project}\n\n{_text(rng, 40, topic=project)}\n"


def _random_file(rng: random.Random, user: str, serial: int) -> tuple[str, str, int]:
    """Return (path, content, size) of one plausible file in ``user``'s home."""
    home = f"/{user}"
    area = rng.choices(["projects", "documents", "photos", "mail"], weights=[5, 3, 3, 2])[0]
    if area == "projects":
        project = rng.choice(PROJECTS)
        part = rng.choices(["src", "docs", "tests", "readme"], weights=[60, 20, 20, 1])[0]
        if part == "readme":
            return f"{home}/projects/{project}/README.txt", (text := _readme(project, rng)), len(text.encode())
        if part == "src":
            path = f"{home}/projects/{project}/src/{rng.choice(PACKAGES)}/{rng.choice(MODULES)}_{serial}.py"
        elif part == "docs":
            path = f"{home}/projects/{project}/docs/{rng.choice(TOPICS)}-{serial}.md"
        else:
            path = f"{home}/projects/{project}/tests/test_{rng.choice(MODULES)}_{serial}.py"
        content = _text(rng, rng.randint(20, 60), topic=project)
    elif area == "documents":
        year = rng.randint(1992, 2015)
        path = f"{home}/documents/{year}/{rng.choice(TOPICS)}/{rng.choice(TOPICS)}-{serial}.txt"
        content = _text(rng, rng.randint(20, 80))
    elif area == "photos":
        year = rng.randint(2000, 2015)
        path = f"{home}/photos/{year}/{rng.choice(MONTHS)}/IMG_{serial:06d}.jpg"
        caption = f"photo {year} {rng.choice(['holiday', 'family', 'garden', 'dinner', 'campaign'])}"
        return path, caption, rng.randint(200_000, 6_000_000)
    else:
        path = f"{home}/mail/{rng.choice(MAIL_FOLDERS)}/{serial:06d}.eml"
        content = f"Subject: {_text(rng, 6)}\n\n{_text(rng, rng.randint(15, 50))}"
    return path, content, len(content.encode())


def generate(files: int, *, users: Sequence[str] | None = None, seed: int = 1992) -> Iterator[Entry]:
    """Yield ``files`` file entries and every directory above them (each once, parents first).

    The tree always holds :data:`README` (when ``clinton`` is one of the
    users); the rest is drawn from a seeded RNG, so the same arguments give
    the same tree.
    """
    rng = random.Random(seed)
    homes = list(users) if users is not None else list(USERS)
    weights = [USERS.get(u, 1) for u in homes]
    seen_dirs: set[str] = set()
    seen_files: set[str] = set()

    def directories(path: str) -> Iterator[Entry]:
        missing = []
        directory = parent_of(path)
        while directory != ROOT and directory not in seen_dirs:
            missing.append(directory)
            directory = parent_of(directory)
        for directory in reversed(missing):
            seen_dirs.add(directory)
            yield Entry(entry_id(directory), directory, parent_of(directory), name_of(directory), DIR, 0, 0)

    serial = 0
    made = 0
    if "clinton" in homes and files > 0:
        content = _readme("elasticsearch", rng)
        yield from directories(README)
        seen_files.add(README)
        yield Entry(entry_id(README), README, parent_of(README), name_of(README), FILE, len(content), 0, content)
        made = 1
    while made < files:
        serial += 1
        user = rng.choices(homes, weights=weights)[0]
        path, content, size = _random_file(rng, user, serial)
        if path in seen_files:
            continue
        seen_files.add(path)
        yield from directories(path)
        yield Entry(entry_id(path), path, parent_of(path), name_of(path), FILE, size, 0, content)
        made += 1
