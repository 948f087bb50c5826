"""Metrics, spans and log lines of real locks on every store: each event moves its own series by exactly one.

Counts are read from a registry of the test's own (``ESDLOCK_METRICS_REGISTRY``),
in a namespace of the test's own, so nothing another test did is counted.
Spans are captured by the OpenTelemetry SDK's in-memory exporter, on a tracer provider of the
module's own (the process's global provider is left alone: other tests' spans stay no-ops).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import uuid
from functools import partial

import pytest
from django.test import override_settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from django_esdlock import (
    LockBackendUnavailable,
    LockDeadlock,
    LockLost,
    LockTimeout,
    LockUnavailable,
    alock_tree,
    global_lock,
    lock_documents,
    lock_tree,
    observability,
    semaphore,
)
from django_esdlock.conf import load_backend
from django_esdlock.observability import store_of
from django_esdlock.observability.tracing import LockTracing
from django_esdlock.reaper import Reaper

from .expiry import expire
from .leases import wait_until
from .observed_holder import WAIT, frozen_holder
from .procs import frozen, spawned

PAIRS = 25
DEADLOCK_TIMEOUT = 0.3


@pytest.fixture
def lock_config(store_config):
    return {**store_config, "DEADLOCK_TIMEOUT": DEADLOCK_TIMEOUT}


@pytest.fixture
def registry():
    """A registry of this test's own, where the locks' metrics go while it runs."""
    registry = CollectorRegistry()
    with override_settings(ESDLOCK_METRICS_REGISTRY=registry, ESDLOCK_SLOW_WAIT=None):
        yield registry


@pytest.fixture
def namespace():
    return f"obs-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def span_provider():
    """A tracer provider of this module's own (the process's global one stays as it was), and its exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def exporter(span_provider):
    """Every span the locks end while the test runs, in memory."""
    provider, exporter = span_provider
    exporter.clear()
    observability.use(dataclasses.replace(observability.state(), tracing=LockTracing(provider)))
    yield exporter
    observability.use(None)


@pytest.fixture
def tracer(span_provider):
    """The test's own spans (a request's), on the same provider."""
    return span_provider[0].get_tracer("tests")


def value(registry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def holds_ended(registry, labels: dict[str, str], outcome: str) -> float:
    """Holds of ``labels`` ended with ``outcome``: the last count a loss's report moves."""
    return value(registry, "esdlock_held_seconds_count", **labels, outcome=outcome)


def losses_reported(registry, labels: dict[str, str], count: int) -> bool:
    return holds_ended(registry, labels, "lost") >= count


def test_pairs_are_counted_exactly(backend, registry, namespace):
    store = store_of(backend)
    assert store in ("elasticsearch", "postgresql", "sqlite")
    for i in range(PAIRS):
        with lock_tree(f"/obs/{i}", namespace=namespace, backend=backend):
            assert value(registry, "esdlock_held", store=store, namespace=namespace) == 1
    with lock_documents(["1", "2"], namespace=namespace, backend=backend):
        pass
    with global_lock(f"obs-{namespace}", backend=backend):
        pass
    with semaphore("obs", 2, namespace=namespace, backend=backend):
        pass

    tree = {"store": store, "namespace": namespace, "kind": "tree"}
    assert value(registry, "esdlock_acquire_seconds_count", **tree, outcome="granted") == PAIRS
    assert value(registry, "esdlock_held_seconds_count", **tree, outcome="released") == PAIRS
    for kind, where in (("documents", namespace), ("global", "default"), ("semaphore", namespace)):
        labels = {"store": store, "namespace": where, "kind": kind}
        assert value(registry, "esdlock_acquire_seconds_count", **labels, outcome="granted") == 1
        assert value(registry, "esdlock_held_seconds_count", **labels, outcome="released") == 1
    assert value(registry, "esdlock_held", store=store, namespace=namespace) == 0
    for outcome in ("timeout", "unavailable", "deadlock", "error"):
        assert value(registry, "esdlock_acquire_seconds_count", **tree, outcome=outcome) == 0
    assert value(registry, "esdlock_held_seconds_count", **tree, outcome="lost") == 0
    # Each grant and each release is at least one round trip to the store.
    requests = {"store": store, "outcome": "ok"}
    assert value(registry, "esdlock_store_request_seconds_count", **requests, operation="acquire") >= PAIRS + 2
    assert value(registry, "esdlock_store_request_seconds_count", **requests, operation="release") >= PAIRS + 2


def test_a_call_with_no_time_left_is_no_store_request(backend, registry, namespace):
    with lock_tree("/obs/late", namespace=namespace, backend=backend) as lock:
        with pytest.raises(LockBackendUnavailable, match="no time left"):
            backend.renew(lock.grant, timeout=0)
    samples = [s for metric in registry.collect() for s in metric.samples]
    renewals = [
        s for s in samples if s.name == "esdlock_store_request_seconds_count" and s.labels["operation"] == "renew"
    ]
    assert renewals == []


def _held_elsewhere(path: str, namespace: str, backend, held: threading.Event, done: threading.Event) -> None:
    with lock_tree(path, namespace=namespace, backend=backend):
        held.set()
        done.wait(WAIT)


def test_a_timeout_and_a_refusal_move_their_own_series_by_one(backend, registry, namespace):
    held, done = threading.Event(), threading.Event()
    holder = threading.Thread(target=_held_elsewhere, args=("/obs/busy", namespace, backend, held, done))
    holder.start()
    try:
        assert held.wait(WAIT)
        with pytest.raises(LockTimeout):
            lock_tree("/obs/busy", namespace=namespace, timeout=0.3, backend=backend).acquire()
        with pytest.raises(LockUnavailable):
            lock_tree("/obs/busy", namespace=namespace, timeout=0, backend=backend).acquire()
    finally:
        done.set()
        holder.join(WAIT)
    assert not holder.is_alive()
    labels = {"store": store_of(backend), "namespace": namespace, "kind": "tree"}
    assert value(registry, "esdlock_acquire_seconds_count", **labels, outcome="timeout") == 1
    assert value(registry, "esdlock_acquire_seconds_count", **labels, outcome="unavailable") == 1
    assert value(registry, "esdlock_acquire_seconds_count", **labels, outcome="granted") == 1
    assert value(registry, "esdlock_held_seconds_count", **labels, outcome="released") == 1


def test_a_deadlock_victim_moves_its_own_series_by_one(backend, registry, namespace, caplog):
    backend.deadlock_timeout = DEADLOCK_TIMEOUT

    async def task(mine: str, theirs: str, both_hold: asyncio.Barrier) -> str:
        async with alock_tree(mine, namespace=namespace, backend=backend):
            await asyncio.wait_for(both_hold.wait(), WAIT)
            try:
                async with alock_tree(theirs, namespace=namespace, backend=backend, timeout=WAIT):
                    return "granted"
            except LockDeadlock:
                return "victim"

    async def main() -> list[str]:
        both_hold = asyncio.Barrier(2)
        try:
            return await asyncio.gather(task("/a/x", "/b", both_hold), task("/b/y", "/a", both_hold))
        finally:
            await backend.aclose()

    with caplog.at_level(logging.WARNING, logger="django_esdlock"):
        assert sorted(asyncio.run(main())) == ["granted", "victim"]
    store = store_of(backend)
    labels = {"store": store, "namespace": namespace, "kind": "tree"}
    assert value(registry, "esdlock_deadlock_victims_total", store=store, namespace=namespace) == 1
    assert value(registry, "esdlock_acquire_seconds_count", **labels, outcome="deadlock") == 1
    assert value(registry, "esdlock_acquire_seconds_count", **labels, outcome="granted") == 3
    assert value(registry, "esdlock_held_seconds_count", **labels, outcome="released") == 3
    (line,) = [r for r in caplog.records if r.getMessage().startswith("deadlock:")]
    assert line.namespace == namespace and line.waited >= DEADLOCK_TIMEOUT
    assert line.targets in (["/a"], ["/b"]) and line.holder_id is None and line.token is None


def test_a_lease_lost_in_the_store_moves_its_own_series_by_one(backend, registry, namespace, caplog):
    lock = lock_tree("/obs/evicted", namespace=namespace, backend=backend).acquire()
    token, holder_id = lock.token, lock.holder_id
    with caplog.at_level(logging.WARNING, logger="django_esdlock"):
        expire(backend, lock.holder_id)  # its next renewal finds the record expired in the store
        wait_until(lambda: lock.lost, what="the loss", timeout=WAIT)
        with pytest.raises(LockLost):
            lock.release()
        store = store_of(backend)
        labels = {"store": store, "namespace": namespace, "kind": "tree"}
        # The renewer reports the loss in its own thread, perhaps a moment after the lock says it is lost.
        wait_until(partial(losses_reported, registry, labels, 1), what="the loss reported", timeout=WAIT)
    assert value(registry, "esdlock_lost_total", store=store, namespace=namespace, reason="record_gone") == 1
    assert value(registry, "esdlock_held_seconds_count", **labels, outcome="lost") == 1
    assert value(registry, "esdlock_held_seconds_count", **labels, outcome="released") == 0
    assert value(registry, "esdlock_held", store=store, namespace=namespace) == 0
    (line,) = [r for r in caplog.records if r.getMessage().startswith("lost ")]
    assert (line.namespace, line.targets, line.token, line.holder_id) == (namespace, ["/obs/evicted"], token, holder_id)
    assert line.owner and line.waited is None


def test_a_holder_frozen_past_its_lease_counts_one_loss(lock_config, namespace):
    """A holder process stopped (SIGSTOP) until another took its lock; thawed, it counts one loss, no release."""
    path = "/obs/frozen"
    ready, go = _queue_and_event()
    with spawned(frozen_holder, [(lock_config, path, namespace, ready, go)]) as workers:
        pid = workers.receive(ready, "the holder was not ready", WAIT)
        with frozen(pid, WAIT):
            backend = load_backend(lock_config)
            try:
                # Granted once the store's clock says the frozen lease ran out: no guessed sleep.
                with lock_tree(path, namespace=namespace, timeout=WAIT, backend=backend):
                    pass
                store = store_of(backend)
            finally:
                backend.close()
        go.set()
        (outcome,) = workers.results(WAIT)
    assert outcome["release"] == "LockLost"
    counts = outcome["counts"]
    assert counts["lost"] == {"lease_expired": 1, "record_gone": 0}, counts
    assert counts["held_seconds"] == {"lost": 1, "released": 0}, counts
    assert counts["held"] == 0 and counts["granted"] == 1 and counts["store"] == store


def _queue_and_event():
    from .peer import SPAWN

    return SPAWN.Queue(), SPAWN.Event()


def test_renewals_are_counted_with_their_lag(backend, registry, namespace):
    lock = lock_tree("/obs/renewed", namespace=namespace, ttl=1.5, backend=backend).acquire()
    store = store_of(backend)
    try:
        wait_until(
            lambda: value(registry, "esdlock_renewals_total", store=store, outcome="ok") >= 2,
            what="two renewals",
            timeout=WAIT,
        )
    finally:
        lock.release()
    assert value(registry, "esdlock_renewal_lag_seconds_count", store=store) >= 2
    assert value(registry, "esdlock_renewals_total", store=store, outcome="lost") == 0


def test_a_slow_grant_logs_one_line_naming_the_lock(backend, namespace, caplog):
    with override_settings(ESDLOCK_SLOW_WAIT=0), caplog.at_level(logging.WARNING, logger="django_esdlock"):
        with lock_documents(["7", "3"], namespace=namespace, backend=backend) as lock:
            token, holder_id, owner = lock.token, lock.holder_id, lock.grant.request.owner.key
    (line,) = [r for r in caplog.records if r.getMessage().startswith("granted ")]
    assert (line.namespace, line.targets, line.token) == (namespace, ["3", "7"], token)
    assert (line.holder_id, line.owner) == (holder_id, owner) and line.waited >= 0


# --- spans -------------------------------------------------------------------------


def by_name(spans, name: str) -> list:
    return [s for s in spans if s.name == name]


def test_spans_are_children_of_the_callers_span_and_carry_the_attributes(backend, exporter, tracer, namespace):
    with tracer.start_as_current_span("request") as request:
        with lock_tree("/obs/spans/file", namespace=namespace, intent={"op": "obs"}, backend=backend) as lock:
            lock.checkpoint({"done": 1})
            token = lock.token
    spans = exporter.get_finished_spans()
    (acquire,) = by_name(spans, "esdlock.acquire")
    (hold,) = by_name(spans, "esdlock.hold")
    parent = request.get_span_context().span_id
    assert acquire.parent.span_id == parent and hold.parent.span_id == parent
    assert acquire.context.trace_id == request.get_span_context().trace_id
    attributes = dict(acquire.attributes)
    assert attributes["esdlock.store"] == store_of(backend)
    assert attributes["esdlock.namespace"] == namespace
    assert attributes["esdlock.kind"] == "tree"
    assert attributes["esdlock.targets"] == ("/obs/spans/file",)
    assert attributes["esdlock.mode"] == "X"
    assert attributes["esdlock.timeout"] == -1.0
    assert attributes["esdlock.outcome"] == "granted"
    assert attributes["esdlock.token"] == token
    assert attributes["esdlock.waited_seconds"] >= 0
    assert hold.attributes["esdlock.token"] == token and hold.attributes["esdlock.outcome"] == "released"
    assert [e.name for e in hold.events] == ["checkpoint"]


def test_a_hold_is_traced_only_when_its_acquire_is(backend, namespace):
    """One sampling decision per lock pair: a sampler that would take the hold alone takes neither."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class HoldsOnly(Sampler):
        def should_sample(self, parent_context, trace_id, name, *args, **kwargs):
            return SamplingResult(Decision.RECORD_AND_SAMPLE if name == "esdlock.hold" else Decision.DROP)

        def get_description(self):
            return "holds only"

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=HoldsOnly())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observability.use(dataclasses.replace(observability.state(), tracing=LockTracing(provider)))
    try:
        with lock_tree("/obs/sampled", namespace=namespace, backend=backend):
            pass
        assert exporter.get_finished_spans() == ()  # the acquire was dropped, so its hold was not begun
    finally:
        observability.use(None)
        provider.shutdown()


def test_a_wait_shows_its_rounds_and_its_outcome(backend, exporter, namespace):
    held, done = threading.Event(), threading.Event()
    holder = threading.Thread(target=_held_elsewhere, args=("/obs/waited", namespace, backend, held, done))
    holder.start()
    try:
        assert held.wait(WAIT)
        exporter.clear()
        with pytest.raises(LockTimeout):
            lock_tree("/obs/waited", namespace=namespace, timeout=0.3, backend=backend).acquire()
    finally:
        done.set()
        holder.join(WAIT)
    (acquire,) = by_name(exporter.get_finished_spans(), "esdlock.acquire")
    assert acquire.attributes["esdlock.outcome"] == "timeout"
    assert "esdlock.token" not in acquire.attributes
    attempts = [e.attributes["esdlock.attempt"] for e in acquire.events if e.name == "esdlock.wait"]
    assert attempts and attempts == list(range(attempts[0], attempts[0] + len(attempts)))  # each round, in turn
    # From the first, unless the SDK dropped the oldest (it keeps a span's last 128 events: a fast store's
    # waiting head polls about once per millisecond).
    assert attempts[0] == 0 or acquire.dropped_events > 0


def test_a_lost_hold_and_a_reap_have_their_spans(backend, exporter, namespace):
    lock = lock_tree("/obs/reaped", namespace=namespace, backend=backend).acquire()
    expire(backend, lock.holder_id)
    report = Reaper(backend, namespace=namespace).run()
    assert len(report.evicted) == 2  # /obs (IX) and /obs/reaped (X)
    with pytest.raises(LockLost):
        lock.release()
    spans = exporter.get_finished_spans()
    (hold,) = by_name(spans, "esdlock.hold")
    assert hold.attributes["esdlock.outcome"] == "lost"
    assert [e.name for e in hold.events] == ["lost"]
    (reap,) = by_name(spans, "esdlock.reap")
    assert reap.attributes["esdlock.namespace"] == namespace and reap.attributes["esdlock.evicted"] == 2


def test_reaped_holders_are_counted(backend, registry, namespace):
    lock = lock_tree("/obs/gone", namespace=namespace, backend=backend).acquire()
    expire(backend, lock.holder_id)
    Reaper(backend, namespace=namespace).run()
    with pytest.raises(LockLost):
        lock.release()
    assert value(registry, "esdlock_reaped_total", namespace=namespace) == 2  # one per node record


def test_a_recovery_is_counted_and_logs_one_line(backend, registry, namespace, caplog, tmp_path):
    from . import handlers  # noqa: F401 - registers the "test-append" recovery handler

    out = tmp_path / "recovered.jsonl"
    lock = lock_tree(
        "/obs/intent", namespace=namespace, intent={"op": "test-append", "file": str(out)}, backend=backend
    )
    lock.acquire()
    expire(backend, lock.holder_id)
    with caplog.at_level(logging.INFO, logger="django_esdlock"):
        report = Reaper(backend, namespace=namespace).run()
    with pytest.raises(LockLost):
        lock.release()
    assert len(report.recovered) == 1 and len(out.read_text().splitlines()) == 1
    (line,) = [r for r in caplog.records if r.getMessage().startswith("recovered")]
    assert line.getMessage().startswith("recovered holder ") and line.namespace == namespace
    assert value(registry, "esdlock_recovered_total", namespace=namespace) == 1


def test_nothing_is_recorded_when_switched_off(backend, namespace):
    registry = CollectorRegistry()
    with override_settings(ESDLOCK_METRICS_REGISTRY=registry, ESDLOCK_METRICS=False, ESDLOCK_TRACING=False):
        with lock_tree("/obs/off", namespace=namespace, backend=backend):
            pass
    assert list(registry.collect()) == []


def test_a_hand_off_ends_the_hold_here_and_a_claim_begins_one(backend, registry, exporter, namespace):
    from django_esdlock import resume_lock

    lock = lock_tree("/obs/handed", namespace=namespace, backend=backend).acquire()
    ticket = lock.handoff()
    store = store_of(backend)
    labels = {"store": store, "namespace": namespace, "kind": "tree"}
    assert value(registry, "esdlock_held_seconds_count", **labels, outcome="handed_off") == 1
    assert value(registry, "esdlock_held", store=store, namespace=namespace) == 0
    with resume_lock(ticket, backend=backend):
        assert value(registry, "esdlock_held", store=store, namespace=namespace) == 1
    assert value(registry, "esdlock_held_seconds_count", **labels, outcome="released") == 1
    assert value(registry, "esdlock_acquire_seconds_count", **labels, outcome="granted") == 1  # a claim is no acquire
    first, claimed = by_name(exporter.get_finished_spans(), "esdlock.hold")
    assert first.attributes["esdlock.outcome"] == "handed_off" and [e.name for e in first.events] == ["handoff"]
    assert claimed.attributes["esdlock.outcome"] == "released"
    assert claimed.attributes["esdlock.holder_id"] == first.attributes["esdlock.holder_id"]


def test_an_async_acquire_is_a_child_of_the_tasks_span(backend, exporter, tracer, namespace):

    async def task(name: str) -> int:
        with tracer.start_as_current_span(name) as span:
            async with alock_tree(f"/obs/{name}", namespace=namespace, backend=backend):
                await asyncio.sleep(0)
            return span.get_span_context().span_id

    async def main() -> list[int]:
        try:
            return await asyncio.gather(task("one"), task("two"))
        finally:
            await backend.aclose()

    parents = asyncio.run(main())
    acquires = by_name(exporter.get_finished_spans(), "esdlock.acquire")
    assert sorted(s.parent.span_id for s in acquires) == sorted(parents)
    for span in acquires:
        assert span.attributes["esdlock.targets"] == (f"/obs/{'one' if span.parent.span_id == parents[0] else 'two'}",)


def test_a_release_racing_the_renewers_report_of_a_loss_counts_it_as_lost(backend, registry, namespace):
    """The renewer sets a lock's loss reason, then reports it: a release in between must not count a release.

    (Seen on CI: the hold was counted as released, and the loss reported a moment later.)
    """
    lock = lock_tree("/obs/race", namespace=namespace, backend=backend).acquire()
    expire(backend, lock.holder_id)
    lock._lost_reason = "its holder record was gone or expired at renewal"  # the renewer's first half
    with pytest.raises(LockLost):
        lock.release()
    store = store_of(backend)
    labels = {"store": store, "namespace": namespace, "kind": "tree"}
    assert holds_ended(registry, labels, "lost") == 1
    assert holds_ended(registry, labels, "released") == 0
    assert value(registry, "esdlock_lost_total", store=store, namespace=namespace, reason="record_gone") == 1


def test_a_loss_told_twice_counts_once_and_a_lock_taken_again_can_be_lost_again(backend, registry, namespace):
    lock = lock_tree("/obs/twice", namespace=namespace, backend=backend)
    store = store_of(backend)
    labels = {"store": store, "namespace": namespace, "kind": "tree"}
    for round_ in (1, 2):
        lock.acquire()
        expire(backend, lock.holder_id)
        wait_until(partial(losses_reported, registry, labels, round_), what="the renewer's loss", timeout=WAIT)
        observability.lost(lock, "its lease ran out before a renewal")  # a release on its way said so too
        with pytest.raises(LockLost):
            lock.release()
        assert value(registry, "esdlock_lost_total", store=store, namespace=namespace, reason="record_gone") == round_
        assert value(registry, "esdlock_lost_total", store=store, namespace=namespace, reason="lease_expired") == 0


@pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")
def test_a_forked_child_holds_none_of_its_parents_locks_and_records_its_own(backend, registry, namespace):
    from .test_forks import in_fork

    store = store_of(backend)
    stop = threading.Event()

    # Without the fork's wait for metric writes, a child inherited a client lock held by this thread
    # and hung at its first write (seen within 20 forks).
    def busy() -> None:  # metrics written in another thread while the parent forks, as the renewer does
        from django_esdlock.observability import renewal

        while not stop.is_set():
            renewal(backend, "ok", 0.001)

    def child() -> dict:
        from django_esdlock.observability import renewal

        before = value(registry, "esdlock_held", store=store, namespace=namespace)
        renewals = value(registry, "esdlock_renewals_total", store=store, outcome="ok")
        renewal(backend, "ok", 0.001)  # the series the parent's thread was writing at the fork
        return {
            "held": before,
            "recorded": value(registry, "esdlock_renewals_total", store=store, outcome="ok") - renewals,
        }

    held = lock_tree("/obs/parent", namespace=namespace, backend=backend).acquire()
    worker = threading.Thread(target=busy)
    worker.start()
    try:
        outcomes = [in_fork(child) for _ in range(20)]
    finally:
        stop.set()
        worker.join(WAIT)
        held.release()
    assert all(o == {"held": 0.0, "recorded": 1.0} for o in outcomes), outcomes


def test_a_bad_setting_is_logged_and_the_lock_still_works(backend, namespace, caplog):
    settings = {"ESDLOCK_METRICS_REGISTRY": "no.such.registry", "ESDLOCK_SLOW_WAIT": "soon"}
    with override_settings(**settings), caplog.at_level(logging.ERROR, logger="django_esdlock"):
        with lock_tree("/obs/misconfigured", namespace=namespace, backend=backend) as lock:
            assert lock.held
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("ESDLOCK_METRICS_REGISTRY 'no.such.registry'") for m in messages), messages
    assert any(m.startswith("ESDLOCK_SLOW_WAIT must be seconds") for m in messages), messages
