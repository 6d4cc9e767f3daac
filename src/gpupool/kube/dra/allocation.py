"""What the scheduler allocated to a ResourceClaim (resource.k8s.io/v1 status.allocation), read
from the claim as the API server serves it: the results of one driver, checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional

from ...core.errors import InvalidInput
from ...core.quantity import BYTE, parse_memory_mib

MEMORY = "memory"  # the consumable capacity gpupool publishes, and claims consume


@dataclass(frozen=True)
class AllocatedDevice:
    """One result of status.allocation.devices.results: a device (or a share of it) for a request."""

    request: str
    pool: str
    device: str
    memory_mib: Optional[int]  # consumedCapacity.memory in MiB (rounded down); None: the whole device
    share_id: str = ""


def allocated_devices(claim: Mapping[str, Any], driver: str) -> List[AllocatedDevice]:
    """The results of `driver` in `claim`'s allocation; InvalidInput when it is not allocated."""
    meta = claim.get("metadata") or {}
    where = f"ResourceClaim {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise InvalidInput(f"{where} is not allocated (no status.allocation): the scheduler has not placed it yet")
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, list):
        raise InvalidInput(f"{where}: status.allocation.devices.results is not a list")
    out = []
    for result in results:
        if not isinstance(result, Mapping) or result.get("driver") != driver:
            continue  # another driver's device in the same claim: its plugin prepares it
        consumed = result.get("consumedCapacity") or {}
        memory = consumed.get(MEMORY) if isinstance(consumed, Mapping) else None
        out.append(
            AllocatedDevice(
                request=str(result.get("request", "")),
                pool=str(result.get("pool", "")),
                device=str(result.get("device", "")),
                memory_mib=None
                if memory is None
                else parse_memory_mib(memory, what=f"{where} consumedCapacity.memory", bare=BYTE),
                share_id=str(result.get("shareID") or ""),
            )
        )
    return out


def reserved_pods(claim: Mapping[str, Any]) -> List[str]:
    """The UIDs of the pods `claim` is reserved for (status.reservedFor, written by the scheduler)."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    if not isinstance(reserved, list):
        return []
    return [
        str(r["uid"])
        for r in reserved
        if isinstance(r, Mapping) and r.get("resource") == "pods" and isinstance(r.get("uid"), str) and r["uid"]
    ]
