"""Freed heap memory handed back to the kernel after connections close (glibc's malloc_trim).

Why: a burst of connections (200 stalled TLS uploads, each with a 256 KiB read buffer
and its TLS state) leaves the allocator's heaps full of freed chunks between live ones,
and glibc returns only the top of a heap by itself. Measured on the webhook: 38.7 MiB
before an attack of 200 stalled uploads, 94.5 MiB kept after it without the trim; with
it 50.0 MiB (the first TLS connections' one-time cost), and the peak went from +58 to
+22 MiB (trims during the attack). malloc_trim(0) releases every free page in every
arena; it runs TRIM_INTERVAL_S after TRIM_AFTER_CLOSES connections closed, through
ctypes (public); where there is no malloc_trim (musl, macOS) nothing runs.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from typing import Callable, Optional

log = logging.getLogger(__name__)

TRIM_INTERVAL_S = 1.0
TRIM_AFTER_CLOSES = 16  # a burst, not the odd client that leaves


def _load_trim() -> Optional[Callable[[int], int]]:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


class HeapTrimmer:
    """Trims the heap TRIM_INTERVAL_S after a burst of closed connections (one pending at a time)."""

    def __init__(self) -> None:
        self._trim = _load_trim()
        self._pending: Optional[asyncio.TimerHandle] = None
        self._closed = 0  # connections closed since the last trim

    def connection_closed(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count a closed connection; schedule a trim on `loop` after a burst of them."""
        self._closed += 1
        if self._closed >= TRIM_AFTER_CLOSES and self._pending is None:
            self._pending = loop.call_later(TRIM_INTERVAL_S, self._run)

    def _run(self) -> None:
        self._pending = None
        self._closed = 0
        if self._trim is not None:
            self._trim(0)
