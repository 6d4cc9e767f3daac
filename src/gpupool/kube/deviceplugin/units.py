"""Device IDs the plugin advertises: 100 per GPU, each one unit (1 %) of that GPU."""

from __future__ import annotations

import hashlib
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ...core.fragmentation import Fragmentation, fragaware_devices
from ...core.model import Device
from ...core.placement import NO_HISTORY
from ..choice import per_gpu_units
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


def preferred_units(
    available: Sequence[str],
    must: Sequence[str],
    size: int,
    table: Mapping[str, Device],
    frag: Optional[Fragmentation] = None,
) -> List[str]:
    """The units to give a container asking for `size` (GetPreferredAllocation), chosen as the pool chooses GPUs.

    Up to one GPU's worth: units of one GPU, the one where the node's fragmentation grows least
    (fragaware; with no history, the fullest that holds them). Whole GPUs: GPUs with all their
    units free. Otherwise, or if that finds nothing: the fullest GPUs' units first.
    """
    chosen = list(must)[:size]
    left = size - len(chosen)
    if left <= 0:
        return chosen
    taken = set(chosen)
    free: Dict[str, List[str]] = {}
    for uid in available:
        if uid not in taken and uid in table:
            free.setdefault(table[uid].uuid, []).append(uid)
    devices = {d.uuid: d for d in table.values()}
    gpus = [devices[u] for u in free]
    free_mib = {d.uuid: len(free.get(d.uuid, ())) * d.memory_mib // UNITS_PER_GPU for d in devices.values()}
    if left <= UNITS_PER_GPU or left % UNITS_PER_GPU == 0:
        count, per_gpu = (1, left) if left <= UNITS_PER_GPU else (left // UNITS_PER_GPU, UNITS_PER_GPU)
        fitting = [(d, per_gpu * d.memory_mib // UNITS_PER_GPU) for d in gpus if len(free[d.uuid]) >= per_gpu]
        if len(fitting) >= count:
            picks = fragaware_devices(list(devices.values()), free_mib, fitting, count, frag or NO_HISTORY)
            return chosen + [uid for d, _ in picks for uid in sorted(free[d.uuid])[:per_gpu]]
    for d in sorted(gpus, key=lambda d: (len(free[d.uuid]), d.index)):
        take = sorted(free[d.uuid])[:left]
        chosen += take
        left -= len(take)
        if left <= 0:
            break
    return chosen


def recorded_units(
    available: Sequence[str], must: Sequence[str], size: int, table: Mapping[str, Device], gpus: Sequence[str]
) -> Optional[List[str]]:
    """`size` units on the GPUs the extender recorded for the container (`gpus`, kube.choice), the
    same share of each; None when those GPUs' free units cannot hold it (the caller then chooses)."""
    per_gpu = per_gpu_units(size, len(gpus))
    if per_gpu is None:
        return None
    free: Dict[str, List[str]] = {}
    for uid in available:
        device = table.get(uid)
        if device is not None:
            free.setdefault(device.uuid, []).append(uid)
    mandatory = set(must)
    chosen: List[str] = []
    for uuid in gpus:
        units = sorted(free.get(uuid, ()), key=lambda u: (u not in mandatory, u))  # the kubelet's must-haves first
        if len(units) < per_gpu:
            return None
        chosen += units[:per_gpu]
    return chosen if mandatory <= set(chosen) else None
