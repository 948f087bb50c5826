"""Nothing a signal receiver does breaks a lock: a grant stays a grant, the renewer goes on, errors are logged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterator

import pytest

from django_esdlock import LockLost, alock_tree, lock_tree, signals
from django_esdlock.conf import load_backend
from django_esdlock.core import registry
from django_esdlock.modes import Mode
from django_esdlock.reaper import Reaper
from django_esdlock.records import Kind, LockRequest, Node, Owner
from django_esdlock.renewal import renewer

from . import handlers  # noqa: F401  (registers the test recovery handlers)
from .contract import refused_to_another_owner
from .leases import wait_renewed, wait_until

TTL = 2.0

SIGNALS = list(signals._NAMES)


class Interrupt(BaseException):
    """Not an Exception: what ``send_robust`` lets through (a KeyboardInterrupt, a task runner's timeout)."""


@pytest.fixture
def backend(store_config):
    backend = load_backend({**store_config, "TTL": TTL})
    yield backend
    backend.close()


@contextlib.contextmanager
def raising_receivers(error: type[BaseException] = RuntimeError, to=SIGNALS) -> Iterator[list[str]]:
    """Connect to the signals ``to`` a receiver that raises ``error``; yield the names of those it was sent."""
    calls: list[str] = []

    def receiver(signal, sender, **kwargs):
        calls.append(signals._NAMES[signal])
        raise error(f"the metrics server is down ({signals._NAMES[signal]})")

    uid = f"raising-{uuid.uuid4().hex}"
    for signal in to:
        signal.connect(receiver, weak=False, dispatch_uid=uid)
    try:
        yield calls
    finally:
        for signal in to:
            signal.disconnect(dispatch_uid=uid)


def nothing_left_of(lock, backend) -> bool:
    """No holder of ``lock``'s request in the store, nor in this process's registry or renewer."""
    in_store = any(backend.node_holders(node) for node, _ in lock.targets)
    registered = any(held.targets == lock.targets for held in registry.of_current_holder())
    renewed = any(held.targets == lock.targets for held in list(renewer._held))
    return not (in_store or registered or renewed)


def expired_holder(backend, path: str, intent=None) -> None:
    """A holder nobody renews, with a lease of a moment."""
    request = LockRequest(
        uuid.uuid4().hex, Owner.current(), ((Node("default", Kind.TREE, path), Mode.X),), ttl=0.05, intent=intent
    )
    assert backend.acquire(request) is not None


def test_raising_receivers_on_every_signal_change_no_outcome(backend, caplog, tmp_path):
    caplog.set_level(logging.ERROR, logger="django_esdlock")
    with raising_receivers() as sent:
        everything_but_the_admin(backend, tmp_path)
    # Every signal but the admin's (tests/test_admin.py) was sent; each error logged with its traceback.
    assert set(sent) == {signals._NAMES[s] for s in SIGNALS} - {"lock_force_released"}
    ours = [r for r in caplog.records if r.name == "django_esdlock" and r.exc_info]
    assert {name for name in sent if not any(f" of {name} raised" in r.getMessage() for r in ours)} == set()


def everything_but_the_admin(backend, tmp_path) -> None:
    """Acquire, release, lose a lock, and reap every kind of dead holder."""
    # A grant stays a grant, and the end of the block releases it.
    with lock_tree("/r/held", backend=backend) as lock:
        assert lock.held
    assert nothing_left_of(lock, backend)
    # A lost lock is reported lost (its release raises LockLost, as for any lost lock).
    lost = lock_tree("/r/lost", backend=backend).acquire()
    assert backend.force_release(lost.holder_id, list(lost.grant.taken))
    wait_until(lambda: lost.lost, what="the renewer noticing the lock is gone")
    with pytest.raises(LockLost):
        lost.release()
    # The reaper does all it has to.
    expired_holder(backend, "/r/reaped")
    expired_holder(backend, "/r/orphan", {"op": "nobody-handles-this"})
    expired_holder(backend, "/r/recovered", {"op": "test-append", "file": str(tmp_path / "runs")})
    intent = {"op": "test-fail-once", "marker": str(tmp_path / "missing"), "file": str(tmp_path / "x")}
    expired_holder(backend, "/r/failing", intent)
    # Until every one is done: Elasticsearch's scripts judge by a clock that lags the search's.
    done: dict[str, set[str]] = {"evicted": set(), "unrecoverable": set(), "recovered": set(), "failed": set()}
    expected = {"evicted": {"/r/reaped"}, "unrecoverable": {"/r/orphan"}, "recovered": {"/r/recovered"}}
    expected["failed"] = {"/r/failing"}

    def reaped_all() -> bool:
        report = Reaper(backend).run()
        done["evicted"] |= {r.node.key for r in report.evicted}
        done["unrecoverable"] |= {r.node.key for r in report.unrecoverable}
        done["recovered"] |= {r["holder"]["path"] for r in report.recovered}
        done["failed"] |= {r["holder"]["path"] for r in report.failed}
        return all(done[kind] >= paths for kind, paths in expected.items())

    wait_until(reaped_all, what=f"reaping {expected}")
    assert (tmp_path / "runs").exists()


@pytest.mark.parametrize("error", [RuntimeError, SystemExit])
def test_a_raising_lock_lost_receiver_stops_no_other_renewal(backend, error):
    first = lock_tree("/first", backend=backend).acquire()
    second = lock_tree("/second", backend=backend).acquire()
    with raising_receivers(error, to=[signals.lock_lost]) as sent:
        backend.force_release(first.holder_id, list(first.grant.taken))
        wait_until(lambda: sent == ["lock_lost"], what="the lost lock's receiver")
        assert first.lost and not second.lost
        wait_renewed(backend, second, leases=3, ttl=TTL)  # the renewer went on after the receiver raised
    second.check()
    assert refused_to_another_owner("/second", backend) == "refused"  # renewed in the store, not only here
    second.release()
    with pytest.raises(LockLost):
        first.release()


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_failure_between_the_grant_and_the_block_gives_the_grant_back(backend, api):
    lock = lock_tree("/given/back", backend=backend)
    with raising_receivers(Interrupt, to=[signals.lock_acquired]) as sent, pytest.raises(Interrupt):
        if api == "sync":
            with lock:
                pytest.fail("the block ran")
        else:

            async def run() -> None:
                try:
                    async with alock_tree("/given/back", backend=backend):
                        pytest.fail("the block ran")
                finally:
                    await backend.aclose()

            asyncio.run(run())
    assert sent == ["lock_acquired"]
    assert nothing_left_of(lock, backend)
    with lock_tree("/given/back", timeout=0, backend=backend) as again:  # no self-deadlock, nobody holds it
        assert again.held


def test_an_unexpected_renewal_error_is_retried(backend, caplog):
    caplog.set_level(logging.INFO, logger="django_esdlock")
    lock = lock_tree("/flaky", backend=backend).acquire()
    real, failed = backend.renew_many, []

    def flaky(grants, *, timeout=None):
        if not failed:
            failed.append(True)
            raise ZeroDivisionError("a bug in a renewal")
        return real(grants, timeout=timeout)

    backend.renew_many = flaky
    renewed = lock._valid_until
    wait_until(lambda: failed and lock._valid_until > renewed, what="a renewal after the failed one")
    assert not lock.lost
    assert any("ZeroDivisionError" in r.getMessage() for r in caplog.records)
    lock.release()


def test_a_loss_found_by_a_renewal_during_the_release_is_signalled_once(backend):
    """The release does not wait for a renewal in flight: if that renewal finds the lease over after the release
    looked, both report the loss, and ``lock_lost`` must still go out once (and again once for the next hold)."""
    told: list[str] = []

    def on_lost(reason, **kwargs):
        told.append(reason)

    signals.lock_lost.connect(on_lost, weak=False)
    try:
        lock = lock_tree("/told/once", ttl=TTL, backend=backend)
        for _ in range(2):  # a second hold of the same Lock is told again
            lock.acquire()
            was_lost = lock._letting_go()  # the release looks: not lost yet
            assert not was_lost
            lock._mark_lost("the renewal in flight found the lease over")  # then the renewal lands
            still_held = backend.release(lock._grant)
            lock._grant = None
            with pytest.raises(LockLost):
                lock._released(still_held, was_lost)
    finally:
        signals.lock_lost.disconnect(on_lost)
    assert told == ["the renewal in flight found the lease over"] * 2
