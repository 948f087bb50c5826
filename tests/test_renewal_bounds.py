"""Renewals bounded by the lease: a hung store call holds back no other lock, and its holder is told on time.

The loss-before-grant rounds compare ``time.monotonic()`` readings of two
processes: on Linux that clock (CLOCK_MONOTONIC) is one for the whole machine.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from django_esdlock import LockLost, LockUnavailable, lock_tree
from django_esdlock.conf import load_backend

from .black_hole import black_holed
from .contract import refused_to_another_owner
from .leases import wait_renewed, wait_until
from .peer import SPAWN, setup_django

TTL = 2.0
"""Short, and no shorter: at 2 s Elasticsearch's margin is still its full 0.5 s (it is capped at TTL/4)."""

KEPT_TTL = 3.0
"""The healthy lock's: its renewals must not fail on a busy machine while it is watched for three leases."""

ROUNDS = 10


def test_a_black_holed_connection_holds_back_no_other_lock(store_config):
    with black_holed(store_config) as (hole_config, hole):
        stuck_backend = load_backend({**hole_config, "TTL": TTL})
        healthy = load_backend({**store_config, "TTL": KEPT_TTL})
        stuck = lock_tree("/hole/stuck", backend=stuck_backend).acquire()
        kept = lock_tree("/hole/kept", backend=healthy).acquire()
        hole.open()
        wait_until(lambda: stuck.lost, what="the stuck lock's loss")
        wait_renewed(healthy, kept, leases=3, ttl=KEPT_TTL)  # the other lock's renewals went on, in the store
        assert hole.caught()  # the stuck lock's renewals did go into the hole
        kept.check()
        assert refused_to_another_owner("/hole/kept", healthy) == "refused"  # renewed in the store, not only here
        kept.release()
        hole.close()
        with pytest.raises(LockLost, match="no renewal succeeded within its lease") as lost:
            stuck.release()
        if "hosts" in store_config["OPTIONS"]:  # the client's request_timeout ended each call within the lease
            assert "Connection timed out" in str(lost.value)
        stuck_backend.close()
        healthy.close()


# --- the black-holed holder is told before anyone else is granted -------------------------


def _serve(config: dict, conn) -> None:
    """Take commands from the test: hold locks (noting when each was lost), or poll for one until granted."""
    setup_django()
    from django_esdlock import signals

    backend = load_backend(config)
    held: dict[str, Any] = {}
    lost: dict[str, tuple[float, bool]] = {}
    noticed = threading.Condition()

    def on_lost(sender, lock, reason, **kwargs) -> None:
        at = time.monotonic()
        try:
            lock.check()
            told = False
        except LockLost:
            told = True
        with noticed:
            lost[lock.holder_id] = (at, told)
            noticed.notify_all()

    signals.lock_lost.connect(on_lost, weak=False)
    while True:
        command, path = conn.recv()
        try:
            if command == "stop":
                conn.send(("ok", None))
                return
            if command == "hold":
                held[path] = lock_tree(path, backend=backend).acquire()
                conn.send(("ok", None))
            elif command == "lost at":
                holder_id = held[path].holder_id
                with noticed:
                    noticed.wait_for(lambda: holder_id in lost, timeout=60)  # noqa: B023
                conn.send(("ok", lost.get(holder_id)))
            elif command == "take":  # as fast as the store answers: the grant comes the moment it may
                deadline = time.monotonic() + 60
                while True:
                    sent = time.monotonic()
                    try:
                        held[path] = lock_tree(path, timeout=0, backend=backend).acquire()
                        break
                    except LockUnavailable:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.002)
                conn.send(("ok", (sent, time.monotonic())))
            elif command == "release":
                try:
                    held.pop(path).release()
                    conn.send(("ok", "released"))
                except LockLost:
                    conn.send(("ok", "LockLost"))
            else:
                raise ValueError(command)
        except Exception:  # noqa: BLE001 - reported to the test
            conn.send(("error", traceback.format_exc()))


class Worker:
    """A spawned process running :func:`_serve`; a command's answer may be awaited later."""

    def __init__(self, config: dict) -> None:
        self._conn, child = SPAWN.Pipe()
        self.process = SPAWN.Process(target=_serve, args=(config, child), daemon=True)
        self.process.start()
        child.close()

    def send(self, command: str, path: str | None = None) -> None:
        self._conn.send((command, path))

    def answer(self, timeout: float = 90) -> Any:
        if not self._conn.poll(timeout):
            raise AssertionError(f"worker {self.process.pid} did not answer within {timeout:g}s")
        try:
            status, value = self._conn.recv()
        except EOFError:
            raise AssertionError(f"worker exited with {self.process.exitcode}") from None
        assert status == "ok", value
        return value

    def call(self, command: str, path: str | None = None) -> Any:
        self.send(command, path)
        return self.answer()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("stop")
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()


@contextlib.contextmanager
def workers(*configs: dict) -> Iterator[list[Worker]]:
    started = [Worker(config) for config in configs]
    try:
        yield started
    finally:
        for worker in started:
            worker.close()


@pytest.mark.slow
def test_a_black_holed_holder_is_told_before_anyone_is_granted(store_config, request):
    rng = random.Random(24)
    with black_holed(store_config) as (hole_config, hole):
        with workers({**hole_config, "TTL": TTL}, {**store_config, "TTL": TTL}) as (holder, contender):
            rounds = []
            for round_ in range(ROUNDS):
                path = f"/told/{round_}"
                holder.call("hold", path)
                time.sleep(rng.uniform(0, TTL / 3))  # the hole opens at any point of a renewal period
                contender.send("take", path)
                hole.open()
                sent, received = contender.answer()
                lost = holder.call("lost at", path)
                hole.close()
                assert lost is not None, f"round {round_}: the holder was never told"
                lost_at, told = lost
                assert told, f"round {round_}: lock.check() passed in the holder's lock_lost receiver"
                rounds.append((lost_at, sent, received))
                assert contender.call("release", path) == "released"
                assert holder.call("release", path) == "LockLost"
    # Ahead of the new grant: of the request that was granted (its sending), not only of its answer.
    ahead = [round((sent - lost_at) * 1000) for lost_at, sent, _ in rounds]
    ahead_of_answer = [round((received - lost_at) * 1000) for lost_at, _, received in rounds]
    store = request.node.callspec.params["store_config"]
    print(
        f"\n{store}: the holder was told before the next grant was sent by {min(ahead)}..{max(ahead)} ms "
        f"(median {statistics.median(ahead):g}), before it was answered by {min(ahead_of_answer)}.."
        f"{max(ahead_of_answer)} ms (median {statistics.median(ahead_of_answer):g}); rounds {ahead}"
    )
    assert all(lost_at < sent for lost_at, sent, _ in rounds), f"told after the next grant was sent: {ahead} ms"
