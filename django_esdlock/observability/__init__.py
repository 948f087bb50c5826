"""What the locks tell operators: Prometheus metrics, OpenTelemetry spans, log lines that name the lock.

The lock code calls the hooks of this package (:mod:`.hooks`, named here) at a few points (acquire, grant,
release, loss, hand-off, renewal, each store round trip, a reaper pass). Each
hook does its share for what is on:

- metrics (:mod:`.metrics`) when ``prometheus_client`` is installed and
  ``settings.ESDLOCK_METRICS`` is not False; on the default registry, or the
  one ``settings.ESDLOCK_METRICS_REGISTRY`` names (a dotted path);
- spans (:mod:`.tracing`) when ``opentelemetry-api`` is installed and
  ``settings.ESDLOCK_TRACING`` is not False;
- log lines (:mod:`.logs`) always; a grant logs when it waited longer than
  ``settings.ESDLOCK_SLOW_WAIT`` seconds (default 1; None: never).

Neither library is imported until the first lock and never when it is
missing: then a hook costs a call and a few attribute reads. What the hooks
keep of a lock lives in its ``_observed_hold`` and ``_observed_loss`` attributes.
"""

from .hooks import (
    AcquireWatch,
    acquiring,
    checkpointed,
    deadlock_victim,
    handed_off,
    holding,
    looking_for_deadlock,
    lost,
    reaping,
    released,
    renewal,
    store_request,
    waiting,
)
from .labels import lock_labels, store_of
from .state import DEFAULT_SLOW_WAIT, State, state, use

__all__ = [
    "DEFAULT_SLOW_WAIT",
    "AcquireWatch",
    "State",
    "acquiring",
    "checkpointed",
    "deadlock_victim",
    "handed_off",
    "holding",
    "lock_labels",
    "looking_for_deadlock",
    "lost",
    "reaping",
    "released",
    "renewal",
    "state",
    "store_of",
    "store_request",
    "use",
    "waiting",
]
