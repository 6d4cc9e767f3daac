"""Which colour a lease's slices take: l<N> (allocated, light) and u<N> (used, dark) in dashboard.css.

Red is kept for trouble (memory used by no lease, a slice used past its
share): no lease colour is red, and tests/serving/server/test_dashboard.py checks
the style sheet's hues.
"""

from __future__ import annotations

import zlib

COLORS = 8  # l0..l7 / u0..u7 in dashboard.css


def lease_color(lease_id: str) -> int:
    """A lease's colour, the same on every GPU, every refresh and in the leases table's key."""
    return zlib.crc32(lease_id.encode()) % COLORS
