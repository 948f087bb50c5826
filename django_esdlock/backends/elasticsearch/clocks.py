"""How far apart the cluster's node clocks are, as ``check --deploy`` measures it against the clock-skew margin.

A lease is stamped by one node's clock (the ingest node's for a fresh grant,
the primary's for a renewal) and judged by the primary's; a failover moves
the primary to a node whose clock may run ahead, which ends the lease early
by the holder's count. The holder takes ``clock_skew_margin`` off its view of
the lease for that; this module tells the operator when the cluster's nodes
are further apart than the margin.

Each node reports its own clock in its node stats (``timestamp``, read while
it answers one ``GET _nodes/stats/os``). Every reading falls inside that
request's round trip, so the readings' spread less the round trip is a lower
bound of the skew: a warning is never a false alarm.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from django.core import checks

from ...exceptions import LockBackendUnavailable
from ...steps import Steps, drive
from .transport import StoreCall


def skew_at_least(clocks_ms: Mapping[str, int], round_trip: float) -> tuple[float, str, str]:
    """Return the least skew the readings prove (seconds, 0 or more), the node furthest ahead and the one behind."""
    if not clocks_ms:
        return 0.0, "", ""
    ahead = max(clocks_ms, key=clocks_ms.__getitem__)
    behind = min(clocks_ms, key=clocks_ms.__getitem__)
    spread = (clocks_ms[ahead] - clocks_ms[behind]) / 1000
    return max(0.0, spread - round_trip), ahead, behind


class NodeClocks:
    """The clock-skew check of an :class:`~django_esdlock.backends.elasticsearch.ElasticsearchLockBackend` (a mixin)."""

    clock_skew_margin: float

    def _node_clocks(self) -> tuple[dict[str, int], float]:
        """Read every node's clock (node name -> epoch ms) in one request; return them and its round trip."""
        return drive(self._node_clocks_steps(), self.perform)  # type: ignore[attr-defined]

    def _node_clocks_steps(self) -> Steps[tuple[dict[str, int], float]]:
        """One try, 5 seconds at most (no busy retry, no resend): a check reports the store as it finds it."""
        call = StoreCall(
            "nodes.stats",
            {"metric": "os", "filter_path": "nodes.*.timestamp,nodes.*.name"},
            options={"request_timeout": 5},
        )
        with self._translate("read the nodes' clocks"):  # type: ignore[attr-defined]
            started = time.monotonic()
            answer = yield call
            round_trip = time.monotonic() - started
        nodes = (answer or {}).get("nodes", {})
        clocks = {node.get("name", key): node["timestamp"] for key, node in nodes.items() if "timestamp" in node}
        return {name: int(ms) for name, ms in clocks.items()}, round_trip

    def _clock_warnings(self) -> list[checks.CheckMessage]:
        try:
            clocks, round_trip = self._node_clocks()
        except LockBackendUnavailable:
            return []  # the other checks say the cluster cannot be read
        skew, ahead, behind = skew_at_least(clocks, round_trip)
        if skew <= self.clock_skew_margin:
            return []
        return [
            checks.Warning(
                f"Elasticsearch node {ahead!r}'s clock runs at least {skew:.3f} s ahead of node {behind!r}'s, more "
                f"than LOCK_BACKEND['CLOCK_SKEW_MARGIN'] ({self.clock_skew_margin:g} s): after a failover a lease "
                "can end, by the new primary's clock, before its holder stops counting on it.",
                hint="Keep the nodes' clocks in step (NTP), or raise CLOCK_SKEW_MARGIN above the skew (and the TTL "
                "to at least four times the margins).",
                id="django_esdlock.W011",
            )
        ]
