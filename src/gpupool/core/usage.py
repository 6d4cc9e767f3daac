"""What the pool's GPUs really do: sampled usage per process, device and lease, and the modes that act on it.

Pure data. The sampler (devices/) fills `ProcessUsage` rows, the watchdog
(enforcement/) attributes them to leases and records one `UsageReport` in the
pool; every view (status table, /v1/status, /metrics) reads that record.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import InvalidInput

if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple


class EnforceMode(enum.Enum):
    """What the watchdog does about a process that breaks the rules."""

    KILL = "kill"  # SIGTERM, then SIGKILL after a short wait
    WARN = "warn"  # log and count only
    OFF = "off"  # not even that

    @classmethod
    def parse(cls, text: str, what: str = "--enforce") -> EnforceMode:
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise InvalidInput(f"{what} {text!r} is unknown: use kill, warn or off") from None


class Violation(enum.Enum):
    """Why the watchdog acted; the `reason` label of gpupool_enforcement_actions_total."""

    OVER_SHARE = "over_share"  # a lease used more memory than its slice for longer than the grace period
    UNLEASED = "unleased"  # a process on a pooled GPU that belongs to no live lease
    # On an `mps` node, a lease's process holding GPU memory outside MPS (its client started when no
    # daemon answered): no memory or SM limit holds it, so it is stopped at once, with no grace.
    OUTSIDE_MPS = "outside_mps"


@dataclass(frozen=True)
class ProcessUsage:
    """One process on one GPU at one sample, with the lease it was attributed to ('' = none)."""

    pid: int
    device_uuid: str
    memory_mib: int
    utilization: Optional[float] = None  # SM busy share in [0, 1]; None where the driver does not say
    lease_id: str = ""
    # Whether the driver lists it as an MPS client (True) or as an ordinary compute process (False);
    # None where it does not say (an older driver, a usage-file row without the flag).
    mps_client: Optional[bool] = None
    # The node's own MPS infrastructure (the MPS server, below the control daemon the node
    # supervises; enforcement/attribution.py decides): no lease's, and never unleased.
    infrastructure: bool = False

    @property
    def unleased(self) -> bool:
        """Whether the process belongs to no live lease and is not the node's own infrastructure."""
        return not self.lease_id and not self.infrastructure

    def to_dict(self) -> Dict[str, Any]:
        return {
            "pid": self.pid,
            "device_uuid": self.device_uuid,
            "memory_mib": self.memory_mib,
            "utilization": self.utilization,
            "lease_id": self.lease_id,
            "mps_client": self.mps_client,
            "infrastructure": self.infrastructure,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessUsage:
        util = data.get("utilization")
        return cls(
            pid=int(data["pid"]),
            device_uuid=str(data["device_uuid"]),
            memory_mib=int(data["memory_mib"]),
            utilization=None if util is None else float(util),
            lease_id=str(data.get("lease_id", "") or ""),
            mps_client=None if data.get("mps_client") is None else bool(data["mps_client"]),
            infrastructure=bool(data.get("infrastructure", False)),
        )


@dataclass(frozen=True)
class DeviceUsage:
    """One GPU at one sample: memory really used (all processes) and how busy it was."""

    uuid: str
    memory_used_mib: int
    utilization: Optional[float] = None  # in [0, 1]

    def to_dict(self) -> Dict[str, Any]:
        return {"uuid": self.uuid, "memory_used_mib": self.memory_used_mib, "utilization": self.utilization}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceUsage:
        util = data.get("utilization")
        return cls(str(data["uuid"]), int(data["memory_used_mib"]), None if util is None else float(util))


@dataclass(frozen=True)
class EnforcementAction:
    """One thing the watchdog did (or, in warn mode, would have done)."""

    at: float
    reason: Violation
    mode: EnforceMode
    pid: int
    device_uuid: str
    memory_mib: int
    lease_id: str = ""
    holder: str = ""

    def describe(self) -> str:
        verb = "killed" if self.mode is EnforceMode.KILL else "warned about"
        owner = f"lease {self.lease_id} of {self.holder}" if self.lease_id else "no lease"
        return f"{verb} pid {self.pid} ({self.reason.value}: {owner}, {self.memory_mib} MiB on {self.device_uuid})"

    def to_dict(self) -> Dict[str, Any]:
        return {
            "at": self.at,
            "reason": self.reason.value,
            "mode": self.mode.value,
            "pid": self.pid,
            "device_uuid": self.device_uuid,
            "memory_mib": self.memory_mib,
            "lease_id": self.lease_id,
            "holder": self.holder,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnforcementAction:
        return cls(
            at=float(data["at"]),
            reason=Violation(data["reason"]),
            mode=EnforceMode(data["mode"]),
            pid=int(data["pid"]),
            device_uuid=str(data["device_uuid"]),
            memory_mib=int(data["memory_mib"]),
            lease_id=str(data.get("lease_id", "") or ""),
            holder=str(data.get("holder", "") or ""),
        )


@dataclass(frozen=True)
class UsageReport:
    """The latest sample of a node's pooled GPUs, with the watchdog's recent actions and totals."""

    sampled_at: float
    devices: Tuple[DeviceUsage, ...] = ()
    processes: Tuple[ProcessUsage, ...] = ()
    actions: Tuple[EnforcementAction, ...] = ()  # the most recent ones, newest last
    actions_total: Mapping[str, int] = field(default_factory=dict)  # Violation value -> count since start

    def lease_memory_mib(self) -> Dict[str, int]:
        """MiB really used per lease id, over all its processes and GPUs."""
        used: Dict[str, int] = {}
        for p in self.processes:
            if p.lease_id:
                used[p.lease_id] = used.get(p.lease_id, 0) + p.memory_mib
        return used

    def unleased(self) -> List[ProcessUsage]:
        """Processes on pooled GPUs that belong to no live lease (the node's MPS server is none)."""
        return [p for p in self.processes if p.unleased]

    def device(self, uuid: str) -> Optional[DeviceUsage]:
        return next((d for d in self.devices if d.uuid == uuid), None)

    @classmethod
    def merge(cls, reports: Sequence[UsageReport]) -> UsageReport:
        """One report over several nodes (status of several servers); dated by the oldest sample."""
        totals: Dict[str, int] = {}
        for report in reports:
            for reason, count in report.actions_total.items():
                totals[reason] = totals.get(reason, 0) + count
        return cls(
            sampled_at=min(r.sampled_at for r in reports),
            devices=tuple(d for r in reports for d in r.devices),
            processes=tuple(p for r in reports for p in r.processes),
            actions=tuple(sorted((a for r in reports for a in r.actions), key=lambda a: a.at)),
            actions_total=totals,
        )

    def to_dict(self) -> Dict[str, Any]:
        return {
            "sampled_at": self.sampled_at,
            "devices": [d.to_dict() for d in self.devices],
            "processes": [p.to_dict() for p in self.processes],
            "actions": [a.to_dict() for a in self.actions],
            "actions_total": {reason.value: int(self.actions_total.get(reason.value, 0)) for reason in Violation},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UsageReport:
        totals = data.get("actions_total") or {}
        return cls(
            sampled_at=float(data.get("sampled_at", 0.0)),
            devices=tuple(DeviceUsage.from_dict(d) for d in data.get("devices", [])),
            processes=tuple(ProcessUsage.from_dict(p) for p in data.get("processes", [])),
            actions=tuple(EnforcementAction.from_dict(a) for a in data.get("actions", [])),
            actions_total={str(k): int(v) for k, v in totals.items()},
        )


def check_interval(value: float, what: str, low: float = 0.05, high: float = 3600.0) -> float:
    """A sampling interval or grace period in seconds, finite and within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{what} {value!r} must be a number of seconds")
    if not low <= value <= high:
        raise InvalidInput(f"{what} {value:g} must be between {low:g} and {high:g} seconds")
    return float(value)


__all__ = [
    "EnforceMode",
    "Violation",
    "ProcessUsage",
    "DeviceUsage",
    "EnforcementAction",
    "UsageReport",
    "check_interval",
]
