"""The semaphore contract (:mod:`.semaphore`) through the blocking API on every store, and through the async API."""

from __future__ import annotations

import queue
import threading

import pytest

from django_esdlock import resume_lock

from ..apis import AsyncApi
from .lock import all_holders
from .semaphore import NAME, WAIT, SemaphoreContract

pytestmark = pytest.mark.contract


class TestSemaphoreContract(SemaphoreContract):
    # Hand-off through the blocking API (tests/apis.py drives no async hand-off; the lock contract has it).
    def test_a_slot_handed_off_is_resumed_by_another_owner_and_still_counts(self, backend, peer):
        slot = self.api.semaphore(NAME, 1, timeout=0, backend=backend).acquire()
        handed_token = slot.token
        ticket = slot.handoff()
        claimed: queue.Queue = queue.Queue()

        def claimant() -> None:
            try:
                with resume_lock(ticket, backend=backend) as resumed:
                    claimed.put(resumed.token)
                    claimed.put(peer.acquire("other", scheme="semaphore", name=NAME, limit=1, timeout=0))
            except Exception as e:  # noqa: BLE001 - the test reads it from the queue
                claimed.put(repr(e))

        thread = threading.Thread(target=claimant, daemon=True)
        thread.start()
        thread.join(WAIT)
        token, other = claimed.get(timeout=WAIT), claimed.get(timeout=WAIT)
        assert isinstance(token, int) and token > handed_token, token  # the claim is a new grant
        assert other == "LockUnavailable"  # the resumed slot is the one slot of the semaphore
        assert all_holders(backend) == []


class TestAsyncSemaphoreContract(SemaphoreContract):
    api = AsyncApi
