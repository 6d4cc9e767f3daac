"""Where a suspended lease runs again: the claim of its parked slices, the same GPUs when they have
room, else others of the same model, and the UUID pairs the driver restores onto. Pure: no I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .model import Claim, Device, GpuRequest, Slice
from .suspension import ParkedSlice

if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Sequence, Tuple


def park(slices: Sequence[Slice], devices: Sequence[Device]) -> Tuple[ParkedSlice, ...]:
    """The slices a lease gives back when suspended, each with its device's model."""
    model_of = {d.uuid: d.name for d in devices}
    return tuple(ParkedSlice(s.device_uuid, s.memory_mib, s.group, model_of.get(s.device_uuid, "")) for s in slices)


def resume_claim(parked: Sequence[ParkedSlice], queue: str, priority: int) -> Claim:
    """The claim that gives a suspended lease room again: per request, as many GPUs of the same
    model, each with the MiB it held (the driver restores onto a GPU of the same model only)."""
    from .filters import Filter  # lazily: the embedded pool loads it only when a lease resumes

    requests: List[GpuRequest] = []
    for group in sorted({p.group for p in parked}):
        members = [p for p in parked if p.group == group]
        model = members[0].model
        filters = (Filter.parse(f"device.name={_glob_literal(model)}"),) if model else ()
        requests.append(GpuRequest(len(members), None, max(p.memory_mib for p in members), filters))
    return Claim(tuple(requests), queue=queue, priority=priority)


def _glob_literal(text: str) -> str:
    """`text` as a filter pattern that matches only itself (fnmatch's brackets quote * ? [)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def same_gpus(parked: Sequence[ParkedSlice], devices: Sequence[Device], allocated: Mapping[str, int]) -> bool:
    """Whether every parked slice fits again on the very GPU it left."""
    free = {d.uuid: d.memory_mib - allocated.get(d.uuid, 0) for d in devices if d.healthy}
    need: Dict[str, int] = {}
    for p in parked:
        need[p.device_uuid] = need.get(p.device_uuid, 0) + p.memory_mib
    return all(uuid in free and free[uuid] >= mib for uuid, mib in need.items())


def remap_of(parked: Sequence[ParkedSlice], slices: Sequence[Slice]) -> Tuple[Tuple[str, str], ...]:
    """(old UUID, new UUID) for every parked GPU when a new placement moved any of them, () when
    none moved. Slices pair up within a request in order. All of them, the unmoved too: the
    driver's restore takes a GPU pair for every GPU it checkpointed, or none."""
    pairs: List[Tuple[str, str]] = []
    for group in sorted({p.group for p in parked}):
        old = [p.device_uuid for p in parked if p.group == group]
        new = [s.device_uuid for s in slices if s.group == group]
        pairs.extend(zip(old, new))
    return tuple(pairs) if any(o != n for o, n in pairs) else ()


def back_in_place(parked: Sequence[ParkedSlice]) -> Tuple[Slice, ...]:
    """The slices of a lease resumed on the very GPUs it left."""
    return tuple(Slice(p.device_uuid, p.memory_mib, p.group) for p in parked)
