"""Every store decides as the reference model does (``django_esdlock.protocol.decide``).

Random requests (tree locks shared and exclusive, with and without intents;
document locks that may reenter some of their ids; slots of a semaphore,
asked with limits that differ) by three owners, releases
and lease ends go to a real store and to the model; after each step the grant
and the store's holders must be the model's. The seed changes with each run
and is printed (``ESDLOCK_MODEL_SEED`` replays one).
"""

from __future__ import annotations

import dataclasses
import os
import random
import uuid

import pytest

from django_esdlock.core import document_targets, semaphore_targets, tree_targets
from django_esdlock.protocol import decide
from django_esdlock.records import LockRequest, Owner

from .contract import all_holders
from .expiry import expire

STEPS = 300
PATHS = ["/p", "/p/a", "/p/b", "/p/a/x", "/q"]
IDS = ["1", "2", "3"]
TICKETS = 1_700_000_000_000_000_000
"""Where the requests' tickets start (ns, as ``time.time_ns()`` gives them)."""


def run_seed() -> int:
    given = os.environ.get("ESDLOCK_MODEL_SEED")
    seed = int(given) if given else random.SystemRandom().randrange(2**31)
    print(f"model seed {seed} (replay: ESDLOCK_MODEL_SEED={seed})")
    return seed


@dataclasses.dataclass
class Model:
    """The store as the model sees it: holder rows ``(node_id, holder_id, mode, owner_key, has_intent, live)``."""

    rows: list[list] = dataclasses.field(default_factory=list)
    markers: list[tuple[str, str, str, int]] = dataclasses.field(default_factory=list)
    """Live waiting markers ``(node_id, holder_id, mode, ticket)``: the test keeps them alive for its length."""
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    """The limit each semaphore's grants recorded last (it stands while a holder counts)."""

    def live(self, holder_id: str) -> bool:
        return any(row[5] for row in self.rows if row[1] == holder_id)

    def counting(self) -> set[tuple[str, str, str]]:
        return {(node_id, holder_id, mode) for node_id, holder_id, mode, _, intent, live in self.rows if live or intent}


def _request(rng: random.Random, owner: Owner) -> LockRequest:
    # Half may wait: their tickets in any order, as the clocks of several hosts would give them.
    ticket = TICKETS + rng.randrange(10**9) if rng.random() < 0.5 else None
    if rng.random() < 0.2:
        targets = semaphore_targets("s", namespace="model")
        return LockRequest(uuid.uuid4().hex, owner, targets, 60, ticket=ticket, holder_limit=rng.choice([1, 2, 2, 3]))
    if rng.random() < 0.6:
        shared = rng.random() < 0.4
        intent = {"op": "model"} if not shared and rng.random() < 0.2 else None
        targets = tree_targets(rng.choice(PATHS), shared=shared, namespace="model", intent=intent)
        return LockRequest(uuid.uuid4().hex, owner, targets, 60, intent=intent, ticket=ticket)
    targets = document_targets(rng.sample(IDS, rng.randint(1, len(IDS))), namespace="model")
    # Which ids a lock of the asking thread would hold: any subset (the store must reenter only those).
    reentered = frozenset(node for node, _ in targets if rng.random() < 0.5)
    return LockRequest(
        uuid.uuid4().hex, owner, targets, 60, reentrant=bool(reentered), reentered=reentered or None, ticket=ticket
    )


def _state(model: Model, request: LockRequest, base: Owner) -> dict:
    """What the model knows of the request's nodes, for a failure's message."""
    asked = {node.id for node, _ in request.targets}
    asking = f"owner {request.owner.thread - base.thread}"
    return {
        "holders": [(r[0], r[1][:6], r[2], "live" if r[5] else "ended",
                     asking if r[3] == request.owner.key else "another owner", r[4])
                    for r in model.rows if r[0] in asked],
        "markers": [(m[0], m[1][:6], m[2], m[3] - TICKETS) for m in model.markers if m[0] in asked],
    }  # fmt: skip


def test_every_store_grants_as_the_model_does(backend, store_config):
    seed = run_seed()
    rng = random.Random(seed)
    base = Owner.current()
    owners = [dataclasses.replace(base, thread=base.thread + i) for i in range(3)]
    # The SQL stores judge every node at once and mark each that refused; Elasticsearch stops at the first
    # refusal of a _bulk it sends in parts (fresh nodes, then known ones), so it marks some of them.
    marks_every_refusal = "Elasticsearch" not in store_config["BACKEND"]
    backend.marker_ttl = 3600.0  # markers outlive the test: the model keeps them until withdrawn
    model, granted, log = Model(), [], []
    for step in range(STEPS):
        where = f"seed {seed}, step {step}, after {log[-6:]}"
        action = rng.random()
        if action < 0.6 or not granted:
            request = _request(rng, rng.choice(owners))
            decision = decide(request, model.rows, model.markers, model.limits)
            grant = backend.acquire(request)
            log.append(("acquire", request.owner.thread - base.thread, [(n.key, m.value) for n, m in request.targets],
                        sorted(n.key for n in request.reentered or ()), request.ticket and request.ticket - TICKETS,
                        "granted" if grant else "refused"))  # fmt: skip
            state = _state(model, request, base)
            assert (grant is not None) == (not decision.refused), f"{where}: the model says {decision} on {state}"
            if grant is not None:
                assert {node.id for node in grant.taken} == {node.id for node, _ in decision.writes}, where
                assert grant.holder_limit == decision.holder_limit, f"{where}: the standing limit"
                if decision.holder_limit is not None:
                    model.limits[decision.writes[0][0].id] = decision.holder_limit
                for node, mode in decision.writes:
                    row = [node.id, request.holder_id, mode.value, request.owner.key, request.intent is not None, True]
                    model.rows.append(row)
                if decision.writes:
                    granted.append(grant)
            elif request.ticket is not None:  # it queued: a marker on each node that refused it, or some of them
                left = {(w.node.id, w.holder_id, w.mode.value, w.ticket) for w in backend.wait_state().waiters}
                left = {m for m in left if m[1] == request.holder_id}
                refused = {(n.id, request.holder_id, m.value, request.ticket) for n, m in decision.refused}
                marked = f"{where}: markers left on {sorted(left)}, refused on {sorted(refused)}"
                assert left and left <= refused, marked
                assert left == refused or not marks_every_refusal, marked
                model.markers += sorted(left)
                if rng.random() < 0.4:  # it gives up
                    log.append(("withdraw", request.holder_id[:6]))
                    backend.withdraw(request)
                    model.markers = [m for m in model.markers if m[1] != request.holder_id]
        elif action < 0.85:
            grant = granted.pop(rng.randrange(len(granted)))
            log.append(("release", grant.request.holder_id[:6]))
            backend.release(grant)
            model.rows = [row for row in model.rows if row[1] != grant.request.holder_id]
        elif live := [g for g in granted if model.live(g.request.holder_id)]:
            grant = rng.choice(live)
            log.append(("lease ends", grant.request.holder_id[:6], "intent" if grant.request.intent else ""))
            expire(backend, grant.request.holder_id)
            for row in model.rows:
                if row[1] == grant.request.holder_id:
                    row[5] = False
        where = f"seed {seed}, step {step}: {log[-6:]}"
        holders = all_holders(backend)
        # An intent is the holder's (SQLite keeps it on the main node's entry alone): ended, every entry counts.
        with_intent = {h.holder_id for h in holders if h.intent is not None}
        counting = [h for h in holders if not h.expired or h.holder_id in with_intent]
        stored = {(h.node.id, h.holder_id, h.mode.value) for h in counting}
        assert stored == model.counting(), f"{where}: the store holds {sorted(stored - model.counting())} more, " \
            f"{sorted(model.counting() - stored)} fewer than the model"  # fmt: skip
        if log[-1][0] == "acquire":
            where += f" on {state}"
        queued = {(w.node.id, w.holder_id, w.mode.value, w.ticket) for w in backend.wait_state().waiters}
        assert queued == set(model.markers), f"{where}: the store's markers {sorted(queued - set(model.markers))} " \
            f"more, {sorted(set(model.markers) - queued)} fewer than the model's"  # fmt: skip
    assert sum(entry[0] == "acquire" and entry[-1] == "refused" for entry in log) > 0, "no request was ever refused"
    assert {"acquire", "release", "lease ends"} <= {entry[0] for entry in log}, f"not every kind of step ran: {log}"


@pytest.fixture
def lock_config(store_config):
    return store_config
