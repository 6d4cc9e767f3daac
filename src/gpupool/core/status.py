"""A pool's status: its devices with their allocation, its leases, queues, isolation and usage.

Apart from core.model because it gathers the modules above the model (queues, usage,
invariants), which import the model: kept there, it made core/ an import circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from .isolation_mode import NodeIsolation
from .model import Device, Lease, allocated_by_device

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from .queues import QueueStatus
    from .usage import UsageReport


# Why a waiting claim waits, as `gpupool queue show` says it: it goes next (room now), there is no
# room for it, it is behind a larger claim that goes first (room it could use is kept for that
# one), its queue would pass its limit, or it is held.
WAIT_NEXT = "next"
WAIT_NO_ROOM = "no-room"
WAIT_BEHIND = "behind"
WAIT_LIMIT = "limit"
WAIT_HELD = "held"
WAIT_REASONS = (WAIT_NEXT, WAIT_NO_ROOM, WAIT_BEHIND, WAIT_LIMIT, WAIT_HELD)


class WaitingClaim(NamedTuple):
    """A claim waiting in the pool's queue, as `gpupool status` and `gpupool queue show` list it: its
    place in the order the pool grants (`Pool.waiting`; held claims last, at place 0), who asks for
    what, since when, and why it waits (`why`: WAIT_REASONS). `status` gives the reason the pool last
    told the claim, `queue show` the reason now."""

    position: int
    ticket: int
    queue: str
    priority: int
    claim: str  # Claim.describe()
    holder: str
    label: str
    queued_at: float
    reason: str  # the last reason the pool gave it ('' until it was tried)
    held: bool = False  # kept in the queue, skipped by grants until released (gpupool claim hold)
    why: str = ""  # queue show: WAIT_REASONS, the kind of `reason`

    def to_dict(self) -> Dict[str, Any]:
        return {
            "position": self.position,
            "ticket": self.ticket,
            "queue": self.queue,
            "priority": self.priority,
            "claim": self.claim,
            "holder": self.holder,
            "label": self.label,
            "queued_at": self.queued_at,
            "reason": self.reason,
            "held": self.held,
            "why": self.why,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WaitingClaim:
        return cls(
            int(data.get("position", 0)),
            int(data.get("ticket", 0)),
            str(data.get("queue", "")),
            int(data.get("priority", 0)),
            str(data.get("claim", "")),
            str(data.get("holder", "")),
            str(data.get("label", "")),
            float(data.get("queued_at", 0.0)),
            str(data.get("reason", "")),
            bool(data.get("held", False)),
            str(data.get("why", "")),
        )


class PoolStatus(NamedTuple):
    """Devices with their allocation, and the live leases: what `gpupool status` shows."""

    devices: Tuple[Device, ...]
    leases: Tuple[Lease, ...]
    queued: int = 0
    node: str = ""
    isolation: NodeIsolation = NodeIsolation()
    usage: Optional[UsageReport] = None  # None until the node's watchdog sampled once
    queues: Tuple[QueueStatus, ...] = ()
    waiting: Tuple[WaitingClaim, ...] = ()
    # Where a pool of emulated GPUs keeps their usage file when GPUPOOL_EMULATED_USAGE names none
    # ("" for real GPUs): the runner's suspend backend and its command use the same one.
    emulated_usage: str = ""

    def allocated(self) -> Dict[str, int]:
        return allocated_by_device(self.leases)

    def problems(self) -> List[str]:
        """Leases on devices that are gone or now too small (core.invariants.lease_problems), as messages."""
        from .invariants import lease_problems  # only here: a run against a server never asks

        return [p.message for p in lease_problems(self.devices, self.leases)]

    def to_dict(self) -> Dict[str, Any]:
        used = self.allocated()
        return {
            "devices": [dict(d.to_dict(), allocated_mib=used.get(d.uuid, 0)) for d in self.devices],
            "leases": [lease.to_dict() for lease in self.leases],
            "queued": self.queued,
            "node": self.node,
            "isolation": self.isolation.to_dict(),
            "usage": self.usage.to_dict() if self.usage is not None else None,
            "problems": self.problems(),
            "queues": [q.to_dict() for q in self.queues],
            "waiting": [w.to_dict() for w in self.waiting],
            "emulated_usage": self.emulated_usage,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolStatus:
        queues = data.get("queues") or []
        usage = None
        if data.get("usage"):  # only then: the usage records are not needed to run a command
            from .usage import UsageReport

            usage = UsageReport.from_dict(data["usage"])
        if queues:  # only then: core.queues imports placement, which a run against a server never needs
            from .queues import QueueStatus

        return cls(
            devices=tuple(Device.from_dict(d) for d in data.get("devices", [])),
            leases=tuple(Lease.from_dict(x) for x in data.get("leases", [])),
            queued=int(data.get("queued", 0)),
            node=str(data.get("node", "")),
            isolation=NodeIsolation.from_dict(data.get("isolation")),
            usage=usage,
            queues=tuple(QueueStatus.from_dict(q) for q in queues),
            waiting=tuple(WaitingClaim.from_dict(w) for w in data.get("waiting") or []),
            emulated_usage=str(data.get("emulated_usage") or ""),
        )


__all__ = ["PoolStatus", "WaitingClaim", "WAIT_REASONS"]
