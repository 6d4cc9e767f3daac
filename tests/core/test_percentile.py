"""core.percentile: the one percentile, and that it is statistics.quantiles' inclusive one."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.percentile import percentile

FINITE = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)


def exact_inclusive(values, q: int) -> Fraction:
    """The inclusive method's q-th cut in exact arithmetic (the rule statistics.quantiles rounds)."""
    data = sorted(Fraction(v) for v in values)
    j, delta = divmod(q * (len(data) - 1), 100)
    return data[j] if delta == 0 else (data[j] * (100 - delta) + data[j + 1] * delta) / 100


@given(st.lists(FINITE, min_size=2, max_size=200))
def test_a_whole_percentile_is_statistics_quantiles_inclusive(values):
    # Both round: each lies within a few units in the last place of the inputs' scale of the exact cut
    # (a cut near 0 between -1e9 and 1e9 cannot be closer than that, relative to itself).
    slack = 4 * math.ulp(max(abs(v) for v in values))
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    for q in range(1, 100):
        exact = exact_inclusive(values, q)
        assert abs(Fraction(percentile(values, q)) - exact) <= slack, q
        assert abs(Fraction(cuts[q - 1]) - exact) <= slack, q


@given(st.lists(FINITE, min_size=1, max_size=50), st.floats(min_value=0, max_value=100))
def test_a_percentile_lies_between_the_least_and_the_greatest(values, q):
    assert min(values) <= percentile(values, q) <= max(values)


def test_ends_small_samples_and_no_values():
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert percentile([3.0, 1.0, 2.0, 4.0], 0) == 1.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert percentile(range(101), 99.5) == 99.5
    assert math.isnan(percentile([], 99))


@pytest.mark.parametrize("q", [-1, 100.5, math.nan])
def test_a_percentile_outside_0_to_100_is_refused_naming_it(q):
    with pytest.raises(ValueError, match="from 0 to 100"):
        percentile([1.0, 2.0], q)
