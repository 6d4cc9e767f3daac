"""Where the dashboard's SVG shapes go: the last hour's line charts and each GPU's memory bar. Pure, no HTML.

The templates draw these. What is here is numbers and plain text (a slice's
hover title holds the pool's names as they are): never markup, so the
templates' autoescaping escapes all of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Tuple

from .history import Point
from .palette import lease_color
from .period import Period
from .units import mib
from .view import GpuRow

BAR_W = 1000.0  # the bars' viewBox width; CSS stretches it to the cell
CHART_W, CHART_H = 300.0, 80.0  # the charts' viewBox
TICKS = 4  # time-axis intervals: a label at each end and at each quarter

Values = Sequence[Tuple[float, float]]  # (time, value)


@dataclass(frozen=True)
class Line:
    """One series of a chart: its name, CSS class, polyline points ("x,y x,y ...") and last value."""

    name: str
    css: str
    points: str
    last: Optional[float]


@dataclass(frozen=True)
class Tick:
    """One mark of the time axis: where (viewBox x) and the time of day it stands for."""

    x: str
    label: str


@dataclass(frozen=True)
class Chart:
    title: str
    top: float  # the y axis' maximum
    lines: Tuple[Line, ...]
    ticks: Tuple[Tick, ...] = ()


class Slab(NamedTuple):
    """One lease's slice in a GPU's bar: what it says on hover, where it is (viewBox units, to 0.1), what is used.

    A tuple, so the template unpacks it in its loop header, and one text for
    the hover title: at 10,000 slices each lookup and each escaped value
    costs milliseconds.
    """

    title: str  # "lease ID (HOLDER): 1.6GiB allocated, 1.2GiB used"
    css: str  # "l<colour>"
    x: str
    width: str
    fill: str  # the class of what its processes use: "u<colour>", "over" past the slice, "" for nothing
    fill_width: str


@dataclass(frozen=True)
class Bar:
    """A GPU's bar: the slices (top row) and all use on the GPU, leased then unleased (bottom row)."""

    slabs: Tuple[Slab, ...]
    used_width: str  # "": usage not sampled
    unleased_width: str  # "": no process of no lease


def bar(g: GpuRow) -> Bar:
    scale = BAR_W / (float(g.device.memory_mib) or 1.0)
    slabs = []
    x = 0.0
    for s in g.segments:
        width = s.allocated_mib * scale
        c = lease_color(s.lease_id)
        used = s.used_mib or 0
        said = "not sampled" if s.used_mib is None else f"{mib(s.used_mib)} used"
        slabs.append(
            Slab(
                f"lease {s.lease_id} ({s.holder}): {mib(s.allocated_mib)} allocated, {said}",
                f"l{c}",
                f"{x:.1f}",
                f"{width:.1f}",
                "" if not used else "over" if used > s.allocated_mib else f"u{c}",
                f"{min(used, s.allocated_mib) * scale:.1f}",
            )
        )
        x += width
    if g.used_mib is None:
        return Bar(tuple(slabs), "", "")
    leased = min(BAR_W, max(0, g.used_mib - g.unleased_mib) * scale)
    unleased = f"{min(BAR_W, g.unleased_mib * scale):.1f}" if g.unleased_mib else ""
    return Bar(tuple(slabs), f"{leased:.1f}", unleased)


def charts(history: Sequence[Point], now: float, period: Period = Period()) -> Tuple[Chart, ...]:
    """Memory (% of the pool), leases and queue length over `period`, oldest at the left, `now` at the right.

    Allocation and leases come from the lease history when the period has it
    (any range, kept across restarts); use and queue length from the samples on
    disk past the last hour (one a minute, 7 days), else from the live samples.
    Each line from the period ends at the live value now.
    """
    since = now - period.span_s
    live = [p for p in history if p.at >= since]
    alloc = list(period.allocated) or [
        (p.at, 100.0 * p.allocated_mib / p.total_mib if p.total_mib else 0.0) for p in live
    ]
    used = [(p.at, 100.0 * p.used_mib / p.total_mib) for p in live if p.used_mib is not None and p.total_mib]
    queued = [(p.at, float(p.queued)) for p in live]
    leases = list(period.leases) or [(p.at, float(p.leases)) for p in live]
    if period.leases and live:
        leases.append((live[-1].at, float(live[-1].leases)))  # the line ends at the count now, not a bucket's mean
    if period.allocated and live and live[-1].total_mib:
        alloc.append((live[-1].at, 100.0 * live[-1].allocated_mib / live[-1].total_mib))
    if period.used:
        used = [*period.used, *used[-1:]]
    if period.queued:
        queued = [*period.queued, *queued[-1:]]
    ticks = time_ticks(now, period.span_s)
    return (
        chart(
            "memory, % of the pool",
            (("allocated", "line-alloc", alloc), ("used", "line-used", used)),
            now,
            period.span_s,
            ticks,
            100.0,
        ),
        chart("leases", (("leases", "line-leases", leases),), now, period.span_s, ticks),
        chart(
            "queue length",
            (("queued", "line-queue", queued),),
            now,
            period.span_s,
            ticks,
        ),
    )


def time_ticks(now: float, span_s: float) -> Tuple[Tick, ...]:
    """The time axis: times of day (with the weekday past a day) at each quarter of the span."""
    fmt = "%a %H:%M" if span_s > 86400 else "%H:%M:%S" if span_s < 3600 else "%H:%M"
    return tuple(
        Tick(f"{CHART_W * k / TICKS:.1f}", time.strftime(fmt, time.localtime(now - span_s * (1 - k / TICKS))))
        for k in range(TICKS + 1)
    )


def chart(
    title: str,
    series: Sequence[Tuple[str, str, Values]],
    now: float,
    span_s: float,
    ticks: Tuple[Tick, ...] = (),
    fixed_max: Optional[float] = None,
) -> Chart:
    """A line chart: x from now-span_s to now, y from 0 to the series' max (or `fixed_max`)."""
    values = [v for _, _, points in series for _, v in points]
    top = fixed_max if fixed_max is not None else max([1.0, *values])
    lines = tuple(
        Line(
            name,
            css,
            " ".join(
                f"{CHART_W * (1 - min(span_s, max(0.0, now - at)) / span_s):.1f},{CHART_H - CHART_H * min(v, top) / top:.1f}"
                for at, v in points
            ),
            points[-1][1] if points else None,
        )
        for name, css, points in series
    )
    return Chart(title, top, lines, ticks)
