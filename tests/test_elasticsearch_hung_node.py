"""A node that stops answering costs a bounded call half its time, not all of it: the next host answers.

The client is given two hosts for one genuine node: through a loopback proxy
that is black-holed (it keeps every socket open and forwards nothing, as a
killed or cut-off node behind a load balancer does), and straight. A renewal
bounded by its lease that goes into the hole first must still be resent to
the other host within that bound.
"""

from __future__ import annotations

import pytest

from django_esdlock.checker.proxy import Proxy
from django_esdlock.conf import load_backend
from django_esdlock.modes import Mode

from .contract import raw_grant
from .stores import es_store

INTO_THE_HOLE = 3
"""Bounded renewals that must meet the hole first; fresh clients try their hosts in an order of their own."""

MAX_CALLS = 60


@pytest.fixture
def hole_first(es_url):
    """A config on a fresh index with the genuine node twice (black-holed proxy, then straight), and the proxy."""
    host, port = es_url.removeprefix("http://").rsplit(":", 1)
    proxy = Proxy(host, int(port))
    with es_store(es_url) as config:
        yield {**config, "OPTIONS": {**config["OPTIONS"], "hosts": [f"http://127.0.0.1:{proxy.port}", es_url]}}, proxy
        proxy.resume()
        proxy.close()


def test_a_bounded_renewal_sent_into_a_hung_node_is_resent_to_the_next_in_time(hole_first):
    config, proxy = hole_first
    straight = load_backend({**config, "OPTIONS": {**config["OPTIONS"], "hosts": config["OPTIONS"]["hosts"][1:]}})
    grant = raw_grant(straight, "/hung", Mode.X, ttl=60)
    outcomes, went_in = [], 0
    while went_in < INTO_THE_HOLE and len(outcomes) < MAX_CALLS:
        two_hosts = load_backend(config)  # a fresh node pool, its hosts in an order of its own
        two_hosts.setup()  # its first use's checks (cluster health, version) while both hosts answer
        held_before = proxy.held
        proxy.black_hole()
        try:
            outcomes.append(two_hosts.renew_many([grant], timeout=2.0))
        except Exception as e:  # noqa: BLE001 - shown by the assertion
            outcomes.append(repr(e))
        finally:
            went_in += proxy.held > held_before
            proxy.resume()
            two_hosts.close()
    assert went_in == INTO_THE_HOLE, f"{went_in} of {len(outcomes)} calls went into the hole"
    assert outcomes == [[True]] * len(outcomes), outcomes
    straight.close()
