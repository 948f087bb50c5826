"""How dead holders go away and half-done changes get finished, on every backend."""

from __future__ import annotations

import datetime
import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_esdlock import LockUnavailable, lock_tree
from django_esdlock.modes import Mode
from django_esdlock.reaper import Reaper
from django_esdlock.signals import lock_reaped, lock_unrecoverable

from .. import handlers  # noqa: F401  (registers the test recovery handlers)
from ..expiry import expire
from ..peer import SPAWN, Peer, setup_django
from ..procs import spawned
from .lock import all_holders, raw_grant


def reap(config, *args: str) -> dict:
    out = io.StringIO()
    with override_settings(LOCK_BACKEND=config):
        call_command("reap_locks", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def _reaper_process(config, start) -> dict[str, int]:
    setup_django()
    from django_esdlock.conf import load_backend

    start.wait(30)
    report = Reaper(load_backend(config)).run()
    return {"recovered": len(report.recovered), "lost_race": len(report.taken_by_other_reaper)}


class ReaperContract:
    """Subclass together with LockBackendContract (it provides ``backend`` and ``lock_config``)."""

    @pytest.fixture
    def peers(self, lock_config):
        started: list[Peer] = []

        def start() -> Peer:
            peer = Peer(lock_config)
            started.append(peer)
            return peer

        yield start
        for peer in started:
            peer.close()

    def test_killed_holder_frees_itself_after_its_ttl(self, lock_config, backend, peers):
        writer, reader = peers(), peers()
        # Each killed as soon as it holds: alive past its first renewal (1 s in), it would have renewed.
        writer.acquire("w", scheme="tree", path="/a/b/c/d", ttl=30)
        writer.kill()
        reader.acquire("r", scheme="tree", path="/x/y", shared=True, ttl=30)
        reader.kill()
        # The store recorded the leases asked for; the dead never renew them.
        leases = {h.expires_at - h.acquired_at for h in all_holders(backend)}
        assert leases == {datetime.timedelta(seconds=30)}, leases
        with pytest.raises(LockUnavailable):
            lock_tree("/a", timeout=0, backend=backend).acquire()
        expire(backend)  # their leases run out
        with lock_tree("/a", timeout=0, backend=backend), lock_tree("/x/y", timeout=0, backend=backend):
            pass  # no reaper ran: acquisition evicted the expired holders it met
        # Acquisition evicts what it meets: the dead records below stay, expired, till reaped, unless
        # the store keeps a holder as one record and evicts it whole (PostgreSQL's grants).
        left = all_holders(backend)
        whole = getattr(backend, "vendor", None) == "postgresql"
        assert {h.node.key for h in left} == (set() if whole else {"/a/b", "/a/b/c", "/a/b/c/d"})
        assert all(h.expired for h in left)
        assert reap(lock_config)["counts"]["evicted"] == len(left)
        assert all_holders(backend) == []

    def test_local_pids_frees_a_killed_holder_at_once(self, lock_config, backend, peers):
        victim = peers()
        victim.acquire("w", scheme="tree", path="/deep/a/b/c", ttl=60)
        victim.kill()
        with pytest.raises(LockUnavailable):
            lock_tree("/deep", timeout=0, backend=backend).acquire()
        assert reap(lock_config, "--dry-run", "--local-pids")["counts"]["dead_local"] == 4
        assert len(all_holders(backend)) == 4  # dry run: untouched
        report = reap(lock_config, "--local-pids")
        assert report["counts"]["dead_local"] == 4 and report["counts"]["evicted"] == 0
        assert {h["path"] for h in report["dead_local"]} == {"/deep", "/deep/a", "/deep/a/b", "/deep/a/b/c"}
        with lock_tree("/deep", timeout=0, backend=backend):
            pass

    def test_only_the_dead_of_three_shared_holders_goes(self, lock_config, backend, peers):
        live_one, live_two, dead = peers(), peers(), peers()
        ids = {}
        for name, peer in (("one", live_one), ("two", live_two), ("dead", dead)):
            ids[name] = peer.acquire(name, scheme="tree", path="/shared/file", shared=True, ttl=30)["holder_id"]
        dead.kill()
        expire(backend, ids["dead"])
        reaped = []
        lock_reaped.connect(receiver := lambda holder, **kw: reaped.append(holder.holder_id))
        try:
            report = reap(lock_config)
        finally:
            lock_reaped.disconnect(receiver)
        assert {h["holder_id"] for h in report["evicted"]} == {ids["dead"]}
        assert set(reaped) == {ids["dead"]}
        left = {(h.node.key, h.holder_id) for h in all_holders(backend)}
        assert left == {(p, ids[n]) for p in ("/shared", "/shared/file") for n in ("one", "two")}
        assert not live_one.is_lost("one") and not live_two.is_lost("two")

    def test_killed_holder_with_intent_is_recovered_exactly_once(self, lock_config, backend, peers, tmp_path):
        for round_ in range(3):
            out = tmp_path / f"runs-{round_}.jsonl"
            victim = peers()
            intent = {"op": "test-append", "file": str(out), "sleep": 0.3}
            old = victim.acquire("rename", scheme="tree", path="/clinton/projects", intent=intent, ttl=30)
            victim.kill()
            expire(backend, old["holder_id"])
            with pytest.raises(LockUnavailable):  # expired, but its intent keeps it until recovered
                lock_tree("/clinton", timeout=0, backend=backend).acquire()
            start = SPAWN.Event()
            with spawned(_reaper_process, [(lock_config, start)] * 2) as reapers:
                start.set()
                outcomes = reapers.results(timeout=60)
            runs = [json.loads(line) for line in out.read_text().splitlines()]
            assert len(runs) == 1, runs
            assert sum(o["recovered"] for o in outcomes) == 1
            assert runs[0]["token"] > old["token"]  # the dead holder's late writes are fenced off
            with lock_tree("/clinton", timeout=0, backend=backend):
                pass

    def test_failed_recovery_stays_visible_and_is_retried(self, lock_config, backend, peers, tmp_path):
        marker, out = tmp_path / "marker", tmp_path / "runs.jsonl"
        victim = peers()
        intent = {"op": "test-fail-once", "marker": str(marker), "file": str(out)}
        dead = victim.acquire("w", scheme="tree", path="/job", intent=intent, ttl=30)["holder_id"]
        victim.kill()
        expire(backend, dead)
        report = reap(lock_config)
        assert report["counts"]["failed"] == 1 and "marker file is missing" in report["failed"][0]["error"]
        (held,) = [h for h in all_holders(backend) if h.node.key == "/job"]
        assert held.recovery["state"] == "failed" and held.recovery["attempts"] == 1
        with pytest.raises(LockUnavailable):
            lock_tree("/job", timeout=0, backend=backend).acquire()
        marker.touch()
        expire(backend, held.holder_id)  # the failed takeover's lease runs out; the next run retries
        report = reap(lock_config)
        assert report["counts"]["recovered"] == 1 and report["recovered"][0]["attempts"] == 2
        assert len(out.read_text().splitlines()) == 1
        assert all_holders(backend) == []

    def test_intent_without_handler_stays_and_signals(self, lock_config, backend, peers):
        victim = peers()
        victim.acquire("w", scheme="tree", path="/orphan", intent={"op": "nobody-handles-this"}, ttl=30)
        victim.kill()
        expire(backend)
        signalled = []
        lock_unrecoverable.connect(receiver := lambda holder, **kw: signalled.append(holder.node.key))
        try:
            report = reap(lock_config)
        finally:
            lock_unrecoverable.disconnect(receiver)
        assert [h["path"] for h in report["unrecoverable"]] == ["/orphan"]
        assert signalled == ["/orphan"]
        assert [h.node.key for h in all_holders(backend)] == ["/orphan"]

    def test_a_holder_whose_main_node_alone_was_released_is_freed(self, lock_config, backend, peers):
        """A release applied in part leaves intention entries that name no intent: freed, never unrecoverable."""
        victim = peers()
        held = victim.acquire("w", scheme="tree", path="/part/ly", intent={"op": "nobody-handles-this"}, ttl=30)
        victim.kill()
        (main,) = [h.node for h in all_holders(backend) if h.holder_id == held["holder_id"] and h.mode is Mode.X]
        backend.force_release(held["holder_id"], [main])  # the main node's part of a release
        # PostgreSQL gives a holder back whole (its grant row); Elasticsearch and SQLite node by node.
        if any(h.holder_id == held["holder_id"] for h in all_holders(backend)):
            expire(backend, held["holder_id"])
            report = reap(lock_config)
            assert report["counts"]["unrecoverable"] == 0, report["unrecoverable"]
            assert report["counts"]["evicted"] == 1, report
        assert all_holders(backend) == []
        with lock_tree("/part", timeout=0, backend=backend):
            pass

    def test_namespace_and_grace_limit_what_is_reaped(self, lock_config, backend, peers):
        victim = peers()
        victim.acquire("a", scheme="tree", path="/n", namespace="one", ttl=30)
        victim.acquire("b", scheme="tree", path="/n", namespace="two", ttl=30)
        victim.kill()
        expire(backend, by=40)  # ended 10 s ago by the store's clock: inside a 60 s grace
        assert reap(lock_config, "--grace", "60")["counts"]["evicted"] == 0
        report = reap(lock_config, "--namespace", "one")
        assert [(h["namespace"], h["path"]) for h in report["evicted"]] == [("one", "/n")]
        assert [h.node.namespace for h in all_holders(backend)] == ["two"]

    def test_reaping_pages_through_many_nodes(self, backend):
        dead = [raw_grant(backend, f"/many/n{i:02d}", Mode.X, ttl=30).request.holder_id for i in range(40)]
        live = lock_tree("/many/live", backend=backend).acquire()
        expire(backend, *dead)
        backend.page_size = 7  # force many pages; memory stays one page of nodes
        counts: list[int] = []
        report = Reaper(backend, progress=lambda stage, count: counts.append(count)).run()
        assert len(report.evicted) == 40 and len({r.node for r in report.evicted}) == 40
        assert len(counts) >= 40 // 7 and counts == sorted(counts) and counts[-1] == 40
        assert {(h.node.key, h.holder_id) for h in all_holders(backend)} == {
            ("/many", live.holder_id),
            ("/many/live", live.holder_id),
        }
        live.release()

    def test_command_output_and_errors(self, lock_config):
        out = io.StringIO()
        with override_settings(LOCK_BACKEND=lock_config):
            call_command("reap_locks", "--dry-run", stdout=out)
            assert "Would remove 0 expired holder(s)." in out.getvalue()
            quiet = io.StringIO()
            call_command("reap_locks", verbosity=0, stdout=quiet)
            assert quiet.getvalue() == ""
            with pytest.raises(CommandError):
                call_command("reap_locks", "--namespace", "bad namespace")
