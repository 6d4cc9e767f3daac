"""The pool's invariants, as pure checks: what `gpupool doctor`, the server's start and status report.

- every slice of a live lease is on a known device, and no device holds more than its memory
  (`lease_problems`: after a restart with fewer or smaller GPUs, some may not);
- the allocation the pool works with equals the sum of the leases' slices, and every
  slice and ticket is well formed (`pool_problems`, over rows read by the caller).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .model import SUSPENDED, Claim, Device, Holder, Lease

if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple


@dataclass(frozen=True)
class Problem:
    """One broken invariant: a stable `kind` and a message that names the lease or device and the fix."""

    kind: str
    message: str

    def to_dict(self) -> Dict[str, str]:
        return {"kind": self.kind, "message": self.message}


def lease_problems(devices: Sequence[Device], leases: Iterable[Lease]) -> List[Problem]:
    """Leases on devices that are gone, and devices whose leases hold more than their memory."""
    by_uuid = {d.uuid: d for d in devices}
    held: Dict[str, int] = {}
    holders: Dict[str, List[str]] = {}
    problems: List[Problem] = []
    for lease in leases:
        for sl in lease.slices:
            if sl.device_uuid not in by_uuid:
                problems.append(
                    Problem(
                        "lease_on_unknown_device",
                        f"lease {lease.id} of {lease.holder.name or '?'} holds {sl.memory_mib} MiB on "
                        f"{sl.device_uuid}, which this pool no longer has: release it (gpupool release {lease.id})",
                    )
                )
                continue
            held[sl.device_uuid] = held.get(sl.device_uuid, 0) + sl.memory_mib
            holders.setdefault(sl.device_uuid, []).append(lease.id)
    for uuid, mib in held.items():
        device = by_uuid[uuid]
        if mib > device.memory_mib:
            problems.append(
                Problem(
                    "device_overcommitted",
                    f"GPU {device.index} {uuid} has {device.memory_mib} MiB but its leases hold {mib} MiB "
                    f"({mib * 100 // max(device.memory_mib, 1)} %; it was bigger before a restart?): no new claim "
                    f"gets memory there until leases {', '.join(sorted(holders[uuid]))} end or are released",
                )
            )
    return problems


def pool_problems(
    devices: Sequence[Device],
    leases: Sequence[Lease],
    allocated: Mapping[str, int],
    tickets: Iterable[Tuple[Any, ...]],
) -> List[Problem]:
    """Every invariant of a pool's rows.

    Args:
        devices, leases: as stored (every lease, expired ones included: they hold memory until reaped).
        allocated: MiB per device as the pool sums it from the slices table.
        tickets: (id, claim JSON, holder JSON, host, pid, created_at, expires_at) of the queue.
    """
    problems = lease_problems(devices, leases)
    summed: Dict[str, int] = {}
    for lease in leases:
        if not lease.slices and lease.state != SUSPENDED:  # a suspended lease gave its GPU memory back
            problems.append(Problem("lease_without_slices", f"lease {lease.id} holds no GPU: release it"))
        if not (math.isfinite(lease.expires_at) and lease.ttl_s > 0):
            problems.append(
                Problem("bad_lease", f"lease {lease.id} has ttl {lease.ttl_s!r} and expiry {lease.expires_at!r}")
            )
        for sl in lease.slices:
            if sl.memory_mib < 1:
                problems.append(Problem("bad_slice", f"lease {lease.id} holds {sl.memory_mib} MiB on {sl.device_uuid}"))
            summed[sl.device_uuid] = summed.get(sl.device_uuid, 0) + sl.memory_mib
    for uuid in sorted(set(summed) | set(allocated)):
        if summed.get(uuid, 0) != allocated.get(uuid, 0):
            problems.append(
                Problem(
                    "allocation_mismatch",
                    f"{uuid}: the pool counts {allocated.get(uuid, 0)} MiB allocated, its leases hold "
                    f"{summed.get(uuid, 0)} MiB",
                )
            )
    for ticket in tickets:
        problem = _ticket_problem(ticket)
        if problem:
            problems.append(Problem("bad_ticket", f"queue ticket {ticket[0]}: {problem}"))
    return problems


def _ticket_problem(ticket: Tuple[Any, ...]) -> str:
    """What is wrong with one queue row, or ''."""
    _id, claim, holder, _host, pid, created_at, expires_at = ticket
    try:
        Claim.from_dict(json.loads(claim))
        Holder.from_dict(json.loads(holder))
    except Exception as err:  # any damage to the row: the message is the finding
        return f"its claim or holder does not parse ({err})"
    if not isinstance(pid, int):
        return f"pid {pid!r} is not a number"
    if not (isinstance(created_at, (int, float)) and isinstance(expires_at, (int, float))):
        return f"times {created_at!r} and {expires_at!r} are not numbers"
    if expires_at < created_at:
        return "it expires before it was created"
    return ""
