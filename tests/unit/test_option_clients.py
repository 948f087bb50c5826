"""Per-call client options: timeouts rounded down to a few values, and one client kept per set of options."""

import time

import pytest

elasticsearch = pytest.importorskip("elasticsearch")

from django_esdlock.backends.elasticsearch.transport import (  # noqa: E402
    OPTION_CLIENTS_KEPT,
    StoreCall,
    bounded,
    rounded_down,
    with_options,
)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(5.9973, 5.9), (6.0, 6.0), (0.999, 0.99), (0.0456, 0.045), (12.34, 12.0), (0.001, 0.001)],
)
def test_a_timeout_is_rounded_down_to_two_significant_digits(seconds, expected):
    assert rounded_down(seconds) == pytest.approx(expected)
    assert rounded_down(seconds) <= seconds  # never past the deadline it serves


def test_a_bounded_call_never_gets_more_time_than_is_left():
    deadline = time.monotonic() + 3.14159
    call = bounded(StoreCall("bulk", {}), "acquire", deadline, share=0.5)
    assert 1.4 <= call.options["request_timeout"] <= 3.14159 / 2


def test_one_client_is_made_per_set_of_options_and_kept():
    client = elasticsearch.Elasticsearch("http://127.0.0.1:9")
    made = []
    real = client.options

    def counted(**options):
        made.append(options)
        return real(**options)

    client.options = counted
    first = with_options(client, {"request_timeout": 5.9})
    assert with_options(client, {"request_timeout": 5.9}) is first
    assert first.transport is client.transport  # the same connections
    assert first._request_timeout == 5.9
    other = with_options(client, {"request_timeout": 5.9, "ignore_status": 404})
    assert other is not first and other._ignore_status == (404,)
    assert len(made) == 2
    for i in range(OPTION_CLIENTS_KEPT + 1):  # a process seeing many sets starts over, bounded
        with_options(client, {"request_timeout": float(i + 10)})
    assert with_options(client, {"request_timeout": 5.9}) is not first
