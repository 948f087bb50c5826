"""What node clocks read in one request prove about their skew (``check --deploy``'s W011)."""

from django_esdlock.backends.elasticsearch.clocks import skew_at_least


def test_node_clocks_prove_no_more_skew_than_their_spread_less_the_round_trip():
    assert skew_at_least({}, 0.01) == (0.0, "", "")
    assert skew_at_least({"a": 1_000_000}, 0.01) == (0.0, "a", "a")
    # b reads 2.5 s ahead of a, within a 0.2 s round trip: at least 2.3 s apart, b ahead.
    assert skew_at_least({"a": 1_000_000, "b": 1_002_500, "c": 1_001_000}, 0.2) == (2.3, "b", "a")
    # A spread inside the round trip proves nothing.
    assert skew_at_least({"a": 1_000_000, "b": 1_000_150}, 0.2)[0] == 0.0
