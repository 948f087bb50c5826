"""The PL/pgSQL functions of the PostgreSQL dialect, one versioned ``.sql`` file each, as migrations install them.

``sql/<function>.v<N>.sql`` is the statement that creates version N of a
function, under a few ``--`` lines saying what changed and which migration
installs it. A shipped version never changes (``tests/test_database.py``
pins each file's statement): a change is a new version and a new migration
that loads it, never a rewrite of an earlier migration's text.

Current: ``esdlock_acquire`` v7 (0008: semaphores; v6 (0007, the lock
delay), v5 and the boolean ``p_reentrant`` overload v4 stay for the
processes of the releases before it) and
``esdlock_release`` v3 (0004). The dialect calls them (``dialect.py``).

Rules the functions keep (and the statements of ``dialect.py``):

- node rows are locked in one global order (bytewise id order) by the first
  statement; every later statement runs with a fresh snapshot (READ
  COMMITTED), so it sees every grant committed before those locks;
- grant rows are locked in bytewise holder id order (key share by a refused
  waiter, update/delete by an evicting acquirer or the reaper), so the two
  kinds of lock never wait on each other in a cycle;
- an entry is added only under its node row's lock, and a grant is judged
  gone only when its row is: releases and renewals touch the grant row
  alone, and expiry is re-checked on the row being deleted (a renewal that
  commits first wins);
- expiry is the database clock (``statement_timestamp()``);
- the mode matrix is not here: the client passes the modes that conflict
  (``django_esdlock.modes`` is its only copy).
"""

from __future__ import annotations

from pathlib import Path

SQL_DIR = Path(__file__).parent / "sql"

CURRENT = {"esdlock_acquire": 7, "esdlock_release": 3}
"""The version of each function the dialect calls (the latest migration installs it)."""


def function_sql(name: str, version: int) -> str:
    """Return the statement that creates version ``version`` of function ``name`` (its header lines left out)."""
    lines = (SQL_DIR / f"{name}.v{version}.sql").read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("--"):
        del lines[0]
    return "".join(lines)
