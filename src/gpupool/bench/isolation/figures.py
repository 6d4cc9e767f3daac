"""The isolation report's figures from probes' samples (pure: no torch, no processes).

A work series is [(time, work done so far), ...] (matmul products, images trained); a latency
series is [(request start, latency s), ...]. Work between two times is interpolated linearly
between the samples around them, so two probes' series can be compared over the same window
although each samples at its own pace.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

from ...core.percentile import percentile

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    Series = Sequence[Tuple[float, float]]

# The bar: a split holds when delivered/asked is within this much of 1.
SPLIT_TOLERANCE = 0.05
# Settling is judged on windows this long, this far apart.
SETTLE_WINDOW_S = 1.0
SETTLE_STEP_S = 0.25


def work_at(series: Series, t: float) -> float:
    """Work done by time `t`, interpolated; clamped to the series' first and last sample."""
    if not series:
        raise ValueError("an empty series has no work")
    times = [s[0] for s in series]
    i = bisect.bisect_left(times, t)
    if i == 0:
        return series[0][1]
    if i >= len(series):
        return series[-1][1]
    (t0, w0), (t1, w1) = series[i - 1], series[i]
    return w0 if t1 == t0 else w0 + (w1 - w0) * (t - t0) / (t1 - t0)


def rate(series: Series, t0: float, t1: float) -> float:
    """Work per second between `t0` and `t1`."""
    if t1 <= t0:
        raise ValueError(f"an empty window [{t0}, {t1}]")
    return (work_at(series, t1) - work_at(series, t0)) / (t1 - t0)


def span(series: Series) -> Tuple[float, float]:
    return series[0][0], series[-1][0]


def common_window(*series: Series) -> Tuple[float, float]:
    """The time every series covers: from the last first sample to the first last one."""
    start = max(s[0][0] for s in series)
    end = min(s[-1][0] for s in series)
    if end <= start:
        raise ValueError("the series do not overlap: the second probe started after the first ended")
    return start, end


def settle_s(first: Series, second: Series, start: float, end: float, level: float) -> Optional[float]:
    """Seconds after `start` from which every SETTLE_WINDOW_S window's second/first work ratio
    stays within SPLIT_TOLERANCE of `level`; None when it never does before `end`."""
    settled: Optional[float] = None
    t = start
    while t + SETTLE_WINDOW_S <= end:
        a = rate(first, t, t + SETTLE_WINDOW_S)
        b = rate(second, t, t + SETTLE_WINDOW_S)
        ok = a > 0 and abs(b / a / level - 1) <= SPLIT_TOLERANCE
        if not ok:
            settled = None
        elif settled is None:
            settled = t - start
        t += SETTLE_STEP_S
    return settled


def _steady_ratio(first: Series, second: Series, start: float, end: float) -> float:
    """The second/first ratio over the window's second half: the level a split settles at."""
    middle = (start + end) / 2
    a = rate(first, middle, end)
    return rate(second, middle, end) / a if a > 0 else math.inf


def split(first: Series, second: Series, asked_first: float, asked_second: float) -> Dict[str, Any]:
    """Two saturating probes on one GPU, `second` started after `first`: delivered vs asked ratio."""
    start, end = common_window(first, second)
    a = rate(first, start, end)
    b = rate(second, start, end)
    asked = asked_second / asked_first
    delivered = b / a if a > 0 else math.inf
    alone_end = second[0][0]
    return {
        "asked": [asked_first, asked_second],
        "asked_ratio": round(asked, 4),
        "delivered_ratio": round(delivered, 4),
        "delivered_share_of_first": round(a / (a + b), 4) if a + b > 0 else None,
        "error": round(delivered / asked - 1, 4),
        "holds": abs(delivered / asked - 1) <= SPLIT_TOLERANCE,
        "window_s": round(end - start, 2),
        "rates": [round(a, 3), round(b, 3)],
        "first_alone_rate": round(rate(first, first[0][0], alone_end), 3) if alone_end > first[0][0] else None,
        "settle_s": settle_s(first, second, start, end, _steady_ratio(first, second, start, end)),
    }


def alone(series: Series, whole_gpu_rate: Optional[float] = None) -> Dict[str, Any]:
    """One probe by itself; against the same probe on the whole GPU when that rate is given."""
    start, end = span(series)
    r = rate(series, start, end)
    out: Dict[str, Any] = {"rate": round(r, 3), "window_s": round(end - start, 2)}
    if whole_gpu_rate:
        out["of_whole_gpu"] = round(r / whole_gpu_rate, 4)
    return out


def latencies(series: Series, start: Optional[float] = None, end: Optional[float] = None) -> Dict[str, Any]:
    """p50/p99/mean (ms) of the requests that started inside [start, end]."""
    lo = -math.inf if start is None else start
    hi = math.inf if end is None else end
    values = [lat for t, lat in series if lo <= t <= hi]
    if not values:
        raise ValueError("no request in the window")
    return {
        "requests": len(values),
        "p50_ms": round(percentile(values, 50) * 1000, 3),
        "p99_ms": round(percentile(values, 99) * 1000, 3),
        "mean_ms": round(sum(values) / len(values) * 1000, 3),
    }


def neighbour(
    inference_alone: Series, trainer_alone: Series, inference_beside: Series, trainer_beside: Series
) -> Dict[str, Any]:
    """A latency-sensitive probe beside a saturating trainer, against each of them alone."""
    start, end = common_window(inference_beside, trainer_beside)
    alone_lat = latencies(inference_alone)
    beside_lat = latencies(inference_beside, start, end)
    trainer_alone_rate = rate(trainer_alone, *span(trainer_alone))
    trainer_rate = rate(trainer_beside, start, end)
    return {
        "inference_alone": alone_lat,
        "inference_beside": beside_lat,
        "p99_vs_alone": round(beside_lat["p99_ms"] / alone_lat["p99_ms"], 3),
        "p50_vs_alone": round(beside_lat["p50_ms"] / alone_lat["p50_ms"], 3),
        "trainer_alone_rate": round(trainer_alone_rate, 2),
        "trainer_beside_rate": round(trainer_rate, 2),
        "trainer_kept": round(trainer_rate / trainer_alone_rate, 4),
        "window_s": round(end - start, 2),
    }


__all__: List[str] = [
    "SPLIT_TOLERANCE",
    "alone",
    "common_window",
    "latencies",
    "neighbour",
    "rate",
    "settle_s",
    "split",
    "work_at",
]
