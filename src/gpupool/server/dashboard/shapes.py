"""Where the dashboard's SVG shapes go: the last hour's line charts and each GPU's memory bar. Pure, no HTML.

The templates draw these. What is here is numbers and plain text (a slice's
hover title holds the pool's names as they are): never markup, so the
templates' autoescaping escapes all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

from .history import Point
from .palette import lease_color
from .units import mib
from .view import GpuRow

BAR_W = 1000.0  # the bars' viewBox width; CSS stretches it to the cell
CHART_W, CHART_H = 300.0, 80.0  # the charts' viewBox
HOUR_S = 3600.0

Values = List[Tuple[float, float]]  # (time, value)


@dataclass(frozen=True)
class Line:
    """One series of a chart: its name, CSS class, polyline points ("x,y x,y ...") and last value."""

    name: str
    css: str
    points: str
    last: Optional[float]


@dataclass(frozen=True)
class Chart:
    title: str
    top: float  # the y axis' maximum
    lines: Tuple[Line, ...]


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


def charts(history: Sequence[Point], now: float) -> Tuple[Chart, ...]:
    """The last hour: memory (% of the pool), leases and queue length."""
    alloc = [(p.at, 100.0 * p.allocated_mib / p.total_mib if p.total_mib else 0.0) for p in history]
    used = [(p.at, 100.0 * p.used_mib / p.total_mib) for p in history if p.used_mib is not None and p.total_mib]
    return (
        chart("memory, % of the pool", (("allocated", "line-alloc", alloc), ("used", "line-used", used)), now, 100.0),
        chart("leases", (("leases", "line-leases", [(p.at, float(p.leases)) for p in history]),), now),
        chart("queue length", (("queued", "line-queue", [(p.at, float(p.queued)) for p in history]),), now),
    )


def chart(
    title: str, series: Sequence[Tuple[str, str, Values]], now: float, fixed_max: Optional[float] = None
) -> Chart:
    """A line chart of the last hour: x from now-3600 s to now, y from 0 to the series' max (or `fixed_max`)."""
    values = [v for _, _, points in series for _, v in points]
    top = fixed_max if fixed_max is not None else max([1.0, *values])
    lines = tuple(
        Line(
            name,
            css,
            " ".join(
                f"{CHART_W * (1 - min(HOUR_S, max(0.0, now - at)) / HOUR_S):.1f},{CHART_H - CHART_H * min(v, top) / top:.1f}"
                for at, v in points
            ),
            points[-1][1] if points else None,
        )
        for name, css, points in series
    )
    return Chart(title, top, lines)
