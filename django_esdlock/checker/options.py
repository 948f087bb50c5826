"""What a lock_check run is asked to do: its size, faults, lease and slack."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .checker import DEFAULT_SLACK
from .failover import DEFAULT_KILL
from .faults import FAULTS
from .guarded import MODES as GUARDED_MODES


@dataclasses.dataclass
class CheckOptions:
    """How big a run is and what it does to the store."""

    processes: int = 8
    seconds: float = 60.0
    faults: Sequence[str] = FAULTS
    seed: int | None = None
    ttl: float = 2.0
    """The workload's lease (seconds): pauses last 1.5 leases, store cuts 0.5-1.5."""
    slack: float = DEFAULT_SLACK
    hold: float | None = None
    """Longest hold of a grant (default the smaller of 0.3 s and a third of the lease)."""
    failover_restart: str | None = None
    """Shell template that starts a killed Elasticsearch node again (placeholders: see :class:`FailoverCommands`)."""
    failover_kill: str = DEFAULT_KILL
    """Shell template that kills a node (default: SIGKILL of the pid it reports, for nodes on this machine)."""
    store_restart: str | None = None
    """Shell command that restarts the store abruptly (e.g. ``pg_ctl restart -m immediate -D DIR``)."""
    store_failover: str | None = None
    """Shell command that kills the store's primary and promotes a standby (see docs/topics/database.md)."""
    semaphores: float = 0.1
    """Share of the workload's requests for its semaphore (limit 2; the rest: trees, documents, the global lock)."""
    guarded: str | None = None
    """Guarded data: each exclusive grant appends to a record of the store's data through the fencing helpers
    (``fenced``), or through plain updates (``plain``, the control run the checker must catch); None: none."""

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault(s) {', '.join(sorted(unknown))}; known: {', '.join(FAULTS)}")
        if self.guarded not in (None, *GUARDED_MODES):
            raise ValueError(f"guarded data mode {self.guarded!r}: one of {', '.join(GUARDED_MODES)}")
        if not 0 <= self.semaphores <= 1:
            raise ValueError(f"the semaphores' share is between 0 and 1, not {self.semaphores!r}")
        if self.processes < 1 or self.seconds <= 0 or self.ttl <= 0 or self.slack < 0:
            raise ValueError("processes, seconds and ttl must be positive, slack not negative")

    @property
    def max_hold(self) -> float:
        return self.hold if self.hold is not None else min(0.3, self.ttl / 3)

    @property
    def max_timeout(self) -> float:
        return self.ttl * 1.5
