"""The one percentile of the project: every p50/p95/p99 gpupool reports (bench, benchmarks/, tests)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of `values`, linear between the closest ranks.

    The value at rank (n - 1) * q / 100 of the n sorted values, interpolated between its two
    neighbours: for a whole q that is `statistics.quantiles(values, n=100, method="inclusive")[q - 1]`
    (numpy's default, "linear"), up to rounding in the last bits; q = 0 is the least value,
    q = 100 the greatest. NaN for no values.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q!r}: give a number from 0 to 100")
    ordered = sorted(values)
    if not ordered:
        return math.nan
    # The rank is (n - 1) * q / 100, split into its whole part and its share of the next gap before
    # dividing, so that for a whole q both are exact (a float rank loses bits as n grows).
    position = (len(ordered) - 1) * q
    j = min(math.floor(position / 100), len(ordered) - 1)
    share = (position - 100 * j) / 100
    low, high = float(ordered[j]), float(ordered[min(j + 1, len(ordered) - 1)])
    # low + share of the gap: exactly `low` on a rank, and never outside [low, high] (clamped
    # against the last bit of rounding), where a weighted mean of the two can stray by one.
    return min(max(low + (high - low) * share, low), high)
