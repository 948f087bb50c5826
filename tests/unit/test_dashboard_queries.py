"""The dashboard picture's queries compute what Prometheus' do: histogram_quantile and rate over a window."""

from __future__ import annotations

import math

import pytest

from django_esdlock.bench.dashboard import Recording, quantile, quantiles_by, rates_by


def test_quantile_interpolates_within_the_bucket_of_its_rank():
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)]
    assert quantile(0.25, buckets) == pytest.approx(0.1)  # rank 10: the first bucket's upper bound
    assert quantile(0.5, buckets) == pytest.approx(0.3)  # rank 20: halfway through (0.1, 0.5]
    assert quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * (39.6 - 30) / 10)
    assert quantile(0.5, [(0.001, 4.0), (math.inf, 4.0)]) == pytest.approx(0.0005)


def test_quantile_of_the_inf_bucket_is_the_highest_finite_bound_and_of_nothing_nan():
    assert quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == 1.0
    assert math.isnan(quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]))


def _recording(*scrapes):
    return Recording("sqlite", 10.0, list(scrapes))


def test_rates_are_increases_over_the_window_by_label():
    granted = ("esdlock_acquire_seconds_count", (("namespace", "a"), ("outcome", "granted")))
    timeout = ("esdlock_acquire_seconds_count", (("namespace", "a"), ("outcome", "timeout")))
    recording = _recording((0.0, {granted: 0.0}), (2.0, {granted: 10.0, timeout: 2.0}), (8.0, {granted: 40.0}))
    rates = rates_by(recording, "esdlock_acquire_seconds_count", "namespace", outcome="granted")
    assert rates["a"] == pytest.approx([0.0, 10.0 / 2.0, 30.0 / 6.0])  # the window starts at the last scrape before it


def test_quantiles_sum_the_buckets_of_a_label_over_the_other_labels():
    def bucket(outcome, le):
        return ("esdlock_acquire_seconds_bucket", (("le", le), ("namespace", "a"), ("outcome", outcome)))

    samples = {bucket("granted", "0.1"): 1.0, bucket("granted", "+Inf"): 1.0}
    samples |= {bucket("timeout", "0.1"): 0.0, bucket("timeout", "+Inf"): 1.0}
    recording = _recording((0.0, samples))
    (series,) = quantiles_by(recording, "esdlock_acquire_seconds", "namespace", (0.5,)).values()
    assert series == [pytest.approx(0.1)]
