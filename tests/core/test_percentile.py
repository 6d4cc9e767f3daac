"""core.percentile: the one percentile, and that it is statistics.quantiles' inclusive one."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.percentile import percentile

FINITE = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)


@given(st.lists(FINITE, min_size=2, max_size=200))
def test_a_whole_percentile_is_statistics_quantiles_inclusive(values):
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    assert [percentile(values, q) for q in range(1, 100)] == pytest.approx(cuts, rel=1e-12, abs=1e-12)


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
