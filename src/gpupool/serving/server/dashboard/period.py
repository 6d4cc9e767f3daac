"""The range the charts and the usage panel cover (15 min, 1 h, 24 h, 7 d), read from the pool's lease history.

The live samples (history.py) cover the last hour in memory only; the lease
history (Pool.history) and live leases cover any range and survive restarts.
Allocation and lease counts over the range are averaged into buckets in one
pass over the leases (a difference array), so 7 days of leases cost
O(leases + buckets), never leases x buckets. Memory used and queue length
over a range longer than the hour come from the samples the server keeps on
disk (store/samples.py, one per minute for 7 days), averaged into the same
number of buckets by the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterable, List, Sequence, Tuple

from ....core.queues import LeaseRecord, UsageRow, UsageSpan, usage_rows, used_gpus
from ....core.status import PoolStatus
from ....pooling.store import samples
from .history import SPAN_S as LIVE_SPAN_S

if TYPE_CHECKING:
    from typing import Optional

    from ....pooling.pool import Pool

RANGES: Dict[str, float] = {"15m": 900.0, "1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
RANGE_NAMES = {"15m": "15 min", "1h": "1 hour", "24h": "24 hours", "7d": "7 days"}
DEFAULT_RANGE = "1h"
BUCKETS = 120  # points per chart line from the history: 30 s at 1 h, 84 min at 7 d
USAGE_ROWS = 10  # per table of the usage panel; the rest summed as "others"

Series = Tuple[Tuple[float, float], ...]  # (time, value)
Span = Tuple[float, float, float]  # (start, end, GPUs held)


@dataclass(frozen=True)
class Period:
    """The chosen range and what the lease history says about it."""

    name: str = DEFAULT_RANGE
    span_s: float = RANGES[DEFAULT_RANGE]
    allocated: Series = ()  # % of the pool's GPUs allocated, per bucket; (): draw from the live samples
    leases: Series = ()  # leases held, per bucket
    by_queue: Tuple[UsageRow, ...] = ()  # GPU-seconds over the range, most used first
    by_holder: Tuple[UsageRow, ...] = ()
    used: Series = ()  # % of the pool's memory used, per bucket, from the samples on disk; (): the live ones
    queued: Series = ()  # claims waiting, per bucket, likewise


def range_of(text: str) -> str:
    """The range a `?range=` asks for; the default for anything else."""
    return text if text in RANGES else DEFAULT_RANGE


def read(pool: Pool, status: PoolStatus, name: str, now: float, wall_now: Optional[float] = None) -> Period:
    """The period `name` ending at `now`: allocation and leases over time, GPU-hours by queue and holder,
    and past the live hour memory used and queue length from the samples on disk.

    The GPU-hours are Pool.usage's sums (pool/accounting.usage: ended leases
    from the history, live ones up to now), taken from the live leases of the
    status already read: Pool.usage would read all 10,000 of them again, once
    per key. `now` is the pool's clock (the lease history's); `wall_now` this
    server's (the samples', as the live ones), `now` when not given.
    """
    span_s = RANGES[range_of(name)]
    since = now - span_s
    spans = usage_spans(pool.history(since, now), status, now)
    gpus = float(len(status.devices)) or 1.0
    allocated, leases = buckets(((s.start, s.end or now, _held(s)) for s in spans), since, now, BUCKETS)
    used: Series = ()
    queued: Series = ()
    if span_s > LIVE_SPAN_S:
        until = now if wall_now is None else wall_now
        used, queued = stored_lines(pool, until - span_s, until)
    return Period(
        range_of(name),
        span_s,
        tuple((t, 100.0 * v / gpus) for t, v in allocated),
        leases,
        _top(usage_rows(spans, since, now, "queue")),
        _top(usage_rows(spans, since, now, "holder")),
        used,
        queued,
    )


def stored_lines(pool: Pool, since: float, until: float) -> Tuple[Series, Series]:
    """Memory used (% of the pool) and queue length over [since, until] from the samples on disk."""
    with pool.store.read() as tx:
        rows = samples.read(tx, since, until, BUCKETS)
    used = tuple((s.at, 100.0 * s.used_mib / s.total_mib) for s in rows if s.used_mib is not None and s.total_mib)
    return used, tuple((s.at, float(s.queued)) for s in rows)


def usage_spans(records: Iterable[LeaseRecord], status: PoolStatus, now: float) -> List[UsageSpan]:
    """Every lease of the range as accounting.usage counts it: those that ended, and the live ones up to now."""
    memory_of = {d.uuid: d.memory_mib for d in status.devices}
    spans = [UsageSpan(r.queue, r.holder, r.label, r.gpus, r.started_at, r.ended_at, r.suspended_s) for r in records]
    for lease in status.leases:
        end = min(now, lease.expires_at)  # one past its expiry that nobody reclaimed yet: until then
        suspended_s = 0.0 if lease.suspension is None else lease.suspension.suspended_seconds(end)
        gpus = used_gpus(lease, memory_of)
        spans.append(
            UsageSpan(lease.queue, lease.holder.name, lease.holder.label, gpus, lease.created_at, end, suspended_s)
        )
    return spans


def _held(span: UsageSpan) -> float:
    """GPUs held on average over a lease's span (its suspended time spread over it)."""
    elapsed = (span.end or span.start) - span.start
    return span.gpus * max(0.0, 1.0 - span.suspended_s / elapsed) if elapsed > 0 else 0.0


def _top(rows: Sequence[UsageRow]) -> Tuple[UsageRow, ...]:
    """The most used rows, the rest summed into one "others" row."""
    if len(rows) <= USAGE_ROWS:
        return tuple(rows)
    rest = rows[USAGE_ROWS - 1 :]
    others = UsageRow(f"{len(rest)} others", sum(r.gpu_seconds for r in rest), sum(r.leases for r in rest))
    return (*rows[: USAGE_ROWS - 1], others)


def buckets(spans: Iterable[Span], since: float, until: float, n: int) -> Tuple[Series, Series]:
    """GPUs held and leases held, each averaged over `n` equal buckets of [since, until], at each bucket's end."""
    width = (until - since) / n
    if width <= 0:
        return (), ()
    gpu = _Accumulator(n)
    count = _Accumulator(n)
    for start, end, held in spans:
        start, end = max(start, since), min(end, until)
        if end <= start:
            continue
        first = min(n - 1, int((start - since) / width))
        last = min(n - 1, int(math.ceil((end - since) / width)) - 1)
        gpu.add(first, last, start, end, since, width, held)
        count.add(first, last, start, end, since, width, 1.0)
    ends = [since + width * (i + 1) for i in range(n)]
    return tuple(zip(ends, gpu.averages(width))), tuple(zip(ends, count.averages(width)))


class _Accumulator:
    """Value-seconds per bucket: partial buckets added directly, whole ones through a difference array."""

    def __init__(self, n: int) -> None:
        self.edge = [0.0] * n
        self.whole = [0.0] * (n + 1)

    def add(self, first: int, last: int, start: float, end: float, since: float, width: float, value: float) -> None:
        if first == last:
            self.edge[first] += value * (end - start)
            return
        self.edge[first] += value * (since + width * (first + 1) - start)
        self.edge[last] += value * (end - (since + width * last))
        self.whole[first + 1] += value * width
        self.whole[last] -= value * width

    def averages(self, width: float) -> List[float]:
        out, running = [], 0.0
        for i, edge in enumerate(self.edge):
            running += self.whole[i]
            out.append((edge + running) / width)
        return out
