"""Device IDs the plugin advertises: 100 per GPU, each one unit (1 %) of that GPU."""

from __future__ import annotations

import hashlib
from typing import Iterable, List, Tuple

from ...core.model import Device
from ..resources import UNITS_PER_GPU

MAX_ID = 63  # the kubelet's limit on a device ID


def gpu_key(uuid: str) -> str:
    """A short stable name for a GPU inside unit IDs (long emulated UUIDs are hashed)."""
    if len(uuid) + 3 <= MAX_ID:
        return uuid
    return "GPU-" + hashlib.sha1(uuid.encode()).hexdigest()[:20]


def unit_ids(devices: Iterable[Device]) -> List[Tuple[str, Device]]:
    """(unit ID, its GPU) for every unit of every device, in a stable order."""
    out: List[Tuple[str, Device]] = []
    for d in sorted(devices, key=lambda d: d.index):
        key = gpu_key(d.uuid)
        out.extend((f"{key}-{i:02d}", d) for i in range(UNITS_PER_GPU))
    return out
