"""Placement: (devices, current allocation, claim) -> slices, or the reason why not.

Pure and deterministic: the pool, the scheduler extender and the property
tests all call the same function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .fragmentation import Fragmentation, ShapeMix, fragaware_devices
from .model import Claim, Device, GpuRequest, Policy, Slice
from .quantity import format_mib

if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

NO_HISTORY = Fragmentation(ShapeMix([]))  # fragaware before any claim was seen: binpack's choice


class Placement(NamedTuple):
    """The outcome of `place`: slices when it fits, else a reason for a human."""

    slices: Optional[Tuple[Slice, ...]]
    reason: str = ""

    @property
    def fits(self) -> bool:
        return self.slices is not None


def place(
    devices: Sequence[Device],
    allocated: Mapping[str, int],
    claim: Claim,
    frag: Optional[Fragmentation] = None,
) -> Placement:
    """Place every request of `claim` on `devices`, all or nothing.

    Args:
        devices: the pool's devices; unhealthy ones are never chosen.
        allocated: MiB already held per device uuid.
        claim: the requests to place; each request's GPUs are distinct devices.
        frag: for the fragaware policy, the fragmentation measure of the claims seen
            (`LearnedMix.frag`); without one it chooses as binpack does.
    """
    placement = _place_in_order(devices, allocated, claim, range(len(claim.requests)), frag)
    if placement.fits or len(claim.requests) == 1:
        return placement
    # Greedy in the given order can strand a big request behind small ones;
    # one retry with the biggest requests first fixes the common gang cases.
    biggest_first = sorted(
        range(len(claim.requests)),
        key=lambda i: -_demand(claim.requests[i], devices),
    )
    retry = _place_in_order(devices, allocated, claim, biggest_first, frag)
    return retry if retry.fits else placement


def could_ever_fit(devices: Sequence[Device], claim: Claim) -> Placement:
    """Placement of `claim` on an empty pool: failure means waiting cannot help."""
    return place(devices, {}, claim)


def _place_in_order(
    devices: Sequence[Device],
    allocated: Mapping[str, int],
    claim: Claim,
    order: Iterable[int],
    frag: Optional[Fragmentation] = None,
) -> Placement:
    free: Dict[str, int] = {d.uuid: d.memory_mib - allocated.get(d.uuid, 0) for d in devices}
    chosen: List[Slice] = []
    for group in order:
        request = claim.requests[group]
        picks = _pick(devices, free, request, claim.policy, frag)
        if isinstance(picks, str):
            prefix = f"request {group + 1} of {len(claim.requests)}: " if len(claim.requests) > 1 else ""
            return Placement(None, prefix + picks)
        for device, mib in picks:
            free[device.uuid] -= mib
            chosen.append(Slice(device.uuid, mib, group))
    chosen.sort(key=lambda s: (s.group, s.device_uuid))
    return Placement(tuple(chosen))


def _pick(
    devices: Sequence[Device],
    free: Mapping[str, int],
    request: GpuRequest,
    policy: Policy,
    frag: Optional[Fragmentation] = None,
) -> Union[List[Tuple[Device, int]], str]:
    """Choose `request.count` distinct devices, or return a reason string."""
    matching = [d for d in devices if d.healthy and request.accepts(d)]
    fitting = [(d, request.memory_on(d)) for d in matching if free[d.uuid] >= request.memory_on(d)]
    if len(fitting) < request.count:
        return _reason(devices, matching, fitting, free, request)
    if policy is Policy.FRAGAWARE:
        # Where the node's expected fragmentation grows least; best fit among equals.
        return fragaware_devices(devices, free, fitting, request.count, frag or NO_HISTORY)
    if policy is Policy.BINPACK:
        # Fullest first (least left over), so whole GPUs stay free for big claims.
        fitting.sort(key=lambda dm: (free[dm[0].uuid] - dm[1], dm[0].node, dm[0].index))
    else:
        # Emptiest first, by share of the device left free.
        fitting.sort(key=lambda dm: (-(free[dm[0].uuid] / dm[0].memory_mib), dm[0].node, dm[0].index))
    return fitting[: request.count]


def _reason(
    devices: Sequence[Device],
    matching: Sequence[Device],
    fitting: Sequence[Tuple[Device, int]],
    free: Mapping[str, int],
    request: GpuRequest,
) -> str:
    wanted = request.describe()
    if not devices:
        return f"needs {wanted}, but the pool has no GPUs"
    if len(matching) < request.count:
        healthy = sum(1 for d in devices if d.healthy)
        return f"needs {wanted}, but only {len(matching)} of the pool's {len(devices)} GPUs ({healthy} healthy) match"
    most_free = max(matching, key=lambda d: free[d.uuid])
    return (
        f"needs {wanted}; {len(fitting)} of {len(matching)} matching GPUs have that much free "
        f"(most free: {format_mib(max(free[most_free.uuid], 0))} on GPU {most_free.index} {most_free.uuid})"
    )


def _demand(request: GpuRequest, devices: Sequence[Device]) -> int:
    """Rough size of a request, to order gang requests biggest first."""
    largest = max((d.memory_mib for d in devices), default=0)
    per_gpu = request.memory_mib if request.memory_mib is not None else (request.fraction or 0) * largest
    return int(per_gpu * request.count)
