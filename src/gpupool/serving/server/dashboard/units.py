"""How a figure reads on the dashboard: memory in human units, short durations, percentages, times of day."""

from __future__ import annotations

import time
from typing import Optional

from ....core.quantity import format_mib


def mib(value: Optional[int]) -> str:
    """MiB in a human unit; '–' when unknown."""
    return "–" if value is None else format_mib(int(value))


def gib(n_bytes: Optional[int]) -> str:
    """Bytes in GiB to two decimals (host memory a suspended lease parked); '–' when unknown."""
    return "–" if n_bytes is None else f"{round(int(n_bytes) / 2**30, 2):g}GiB"


def duration(seconds: float) -> str:
    """A short human duration: 42s, 3m 05s, 2h 07m, 3d 4h."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def percent(part: float, whole: float) -> str:
    """`part` as a whole percentage of `whole`; '–' when there is no whole."""
    return f"{100.0 * part / whole:.0f}%" if whole else "–"


def clock(at: float) -> str:
    """A wall-clock time of day, local to the server."""
    return time.strftime("%H:%M:%S", time.localtime(at))
