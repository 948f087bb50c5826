"""A lock holder to run in a pid namespace of its own (``unshare --pid --fork --mount-proc``), as a container would.

Reads a LOCK_BACKEND config (JSON) from argv, takes ``/container/job``,
prints one JSON line (holder id, pid, owner fields) and holds the lock,
renewed, until its stdin closes; then releases it and prints whether it was
lost meanwhile.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django_esdlock import LockLost, lock_tree
    from django_esdlock.conf import load_backend

    backend = load_backend(json.loads(sys.argv[1]))
    lock = lock_tree("/container/job", namespace="pidns", ttl=float(sys.argv[2]), backend=backend).acquire()
    (record,) = [r for r in backend.holder_records(lock.holder_id) if r.node.key == "/container/job"]
    print(json.dumps({"holder_id": lock.holder_id, "pid": os.getpid(), "owner": dict(record.owner)}), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    try:
        lock.release()
    except LockLost:
        print(json.dumps({"lost": True}), flush=True)
    else:
        print(json.dumps({"lost": False}), flush=True)


if __name__ == "__main__":
    main()
