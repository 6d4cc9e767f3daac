"""The last hour of the pool in memory: allocation, usage, leases and queue length, one point per period.

The server records a point from its own status on a timer (the app's
lifespan), so the charts cover the hour before anyone opened the page. A
restart starts a new hour; one point a minute is also kept on disk
(store/samples.py) for the ranges past the hour (period.py).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Deque, Optional, Tuple

from ....core.status import PoolStatus

PERIOD_S = 10.0
SPAN_S = 3600.0


@dataclass(frozen=True)
class Point:
    at: float
    total_mib: int
    allocated_mib: int
    used_mib: Optional[int]  # None: not sampled
    leases: int
    queued: int


def point_of(status: PoolStatus, now: float) -> Point:
    """The chart point of one status (the page adds the current one to the recorded hour)."""
    used: Optional[int] = None
    if status.usage is not None:
        used = sum(d.memory_used_mib for d in status.usage.devices)
    return Point(
        at=now,
        total_mib=sum(d.memory_mib for d in status.devices),
        allocated_mib=sum(status.allocated().values()),
        used_mib=used,
        leases=len(status.leases),
        queued=status.queued,
    )


class History:
    """A bounded ring of `Point`s, safe to record from one thread and read from others."""

    def __init__(self, period_s: float = PERIOD_S, span_s: float = SPAN_S) -> None:
        self.period_s = period_s
        self.span_s = span_s
        self._points: Deque[Point] = deque(maxlen=int(span_s / period_s) + 1)
        self._lock = threading.Lock()

    def due(self, now: float) -> bool:
        """Whether a point should be recorded at `now` (one per period)."""
        with self._lock:
            return not self._points or now - self._points[-1].at >= self.period_s * 0.95

    def record(self, status: PoolStatus, now: float) -> Point:
        """Add the point of `status` at `now`."""
        point = point_of(status, now)
        with self._lock:
            self._points.append(point)
        return point

    def points(self, now: float) -> Tuple[Point, ...]:
        """The points of the last `span_s` before `now`, oldest first."""
        with self._lock:
            return tuple(p for p in self._points if now - p.at <= self.span_s)
