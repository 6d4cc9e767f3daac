"""The env contract of a `gpupool run` child: which GPUs it sees and how much of each it may use."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from ..core.model import Device, Lease, Slice

HOOK_DEBUG_ENV = "GPUPOOL_HOOK_DEBUG"
# The lease a process belongs to; the runner's guard and the server's watchdog find processes by it.
LEASE_ID_ENV = "GPUPOOL_LEASE_ID"


@dataclass(frozen=True)
class GpuShare:
    """One visible GPU of the child: its UUID, the MiB it may use and that share of the device."""

    uuid: str
    memory_mib: int
    device_memory_mib: int

    @property
    def fraction(self) -> float:
        # Rounded down, so a framework limit never exceeds what the pool granted.
        if self.device_memory_mib <= 0:
            return 1.0
        return max(math.floor(self.memory_mib / self.device_memory_mib * 10000) / 10000, 0.0001)


def shares(lease: Lease, devices: Sequence[Device], group: Optional[int] = None) -> List[GpuShare]:
    """The GPUs of `lease` (one request `group`, or all) in visible order, sized from `devices`."""
    by_uuid: Dict[str, Device] = {d.uuid: d for d in devices}
    chosen: Sequence[Slice] = lease.slices if group is None else lease.group(group)
    result = []
    for s in chosen:
        device = by_uuid.get(s.device_uuid)
        # An unknown device (inventory changed) still gets its MiB limit; the fraction is then 1.
        total = device.memory_mib if device is not None else s.memory_mib
        result.append(GpuShare(s.device_uuid, s.memory_mib, total))
    return result


def _fmt(fraction: float) -> str:
    return f"{fraction:.4f}".rstrip("0").rstrip(".")


def isolation_env(lease_id: str, gpus: Sequence[GpuShare], hook_dir: Optional[str] = None) -> Dict[str, str]:
    """The contract variables for a child holding `gpus` (see docs/CONTRACTS.md)."""
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus),
        LEASE_ID_ENV: lease_id,
        "GPUPOOL_MEMORY_LIMIT_MIB": ",".join(str(g.memory_mib) for g in gpus),
        "GPUPOOL_MEMORY_FRACTION": ",".join(_fmt(g.fraction) for g in gpus),
        # MPS numbers devices as the client sees them, i.e. after CUDA_VISIBLE_DEVICES.
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ",".join(f"{i}={g.memory_mib}M" for i, g in enumerate(gpus)),
    }
    if gpus:
        # One value for all GPUs in both cases: take the largest share for
        # compute (never starve) and the smallest for JAX memory (never overrun).
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(
            min(100, max(1, math.ceil(max(g.fraction for g in gpus) * 100 - 1e-9)))
        )
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = _fmt(min(g.fraction for g in gpus))
    if hook_dir:
        env["GPUPOOL_HOOK_DIR"] = hook_dir
    return env


def child_env(base: Mapping[str, str], contract: Mapping[str, str]) -> Dict[str, str]:
    """`base` (the runner's env) with `contract` applied and the hook dir first on PYTHONPATH."""
    env = dict(base)
    env.update(contract)
    hook_dir = contract.get("GPUPOOL_HOOK_DIR")
    if hook_dir:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != hook_dir]
        env["PYTHONPATH"] = os.pathsep.join([hook_dir] + rest)
    return env
