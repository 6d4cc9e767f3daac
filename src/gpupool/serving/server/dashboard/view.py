"""What the dashboard shows, derived from one `PoolStatus`: pure, no HTML, no I/O.

Every figure comes from the pool's status and its usage record (the
watchdog's), the same record `gpupool status` and /metrics read; nothing is
measured here. One pass over leases and processes each, so a pool of 1,000
GPUs and 10,000 leases builds in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ....core.model import Device, Holder, Lease, pod_of_label
from ....core.placement import place
from ....core.quantity import format_mib
from ....core.queues import QueuedClaim, QueueStatus
from ....core.status import PoolStatus
from ....core.suspension import RESUMING, RUNNING, SUSPENDED
from ....core.usage import EnforcementAction, ProcessUsage
from .palette import lease_color
from .period import Period

# A resuming lease's state stays in host memory until its runner restores it.
JOB_LABEL_PREFIX = "job/"  # the local jobs floor labels its gang's lease "job/NAME" (jobs/executors/local)
PARKED_STATES = (SUSPENDED, RESUMING)
LEASE_LIMIT = 500  # lease rows on one page; the rest is counted, and found with the filter


@dataclass(frozen=True)
class Segment:
    """One lease's slice of one GPU, and what its processes really use there."""

    lease_id: str
    holder: str
    allocated_mib: int
    used_mib: Optional[int]  # None: the node's usage is not sampled


@dataclass(frozen=True)
class GpuRow:
    device: Device
    allocated_mib: int
    used_mib: Optional[int]  # every process on the GPU, leased or not; None: not sampled
    unleased_mib: int
    utilization: Optional[float]
    segments: Tuple[Segment, ...]


@dataclass(frozen=True)
class NodeRow:
    node: str
    gpus: int
    healthy: int
    total_mib: int
    allocated_mib: int
    used_mib: Optional[int]


@dataclass(frozen=True)
class LeaseRow:
    lease: Lease
    holder: str  # "alice@host:123", the pod's "namespace/name" on Kubernetes, "alice" for a job's lease
    namespace: str
    pod: str
    share: str  # what it holds on each GPU
    allocated_mib: int
    used_mib: Optional[int]
    age_s: float
    expires_in_s: float
    state: str = RUNNING  # core.suspension's words: running, suspending, suspended, resuming
    parked_bytes: Optional[int] = None  # host memory holding a suspended lease's GPU state; None: not parked
    error: str = ""  # its last suspend or restore that failed
    label: str = ""
    queue: str = ""  # "": the pool's default
    job: str = ""  # the job of `gpupool submit` whose gang holds it; "" for any other lease
    color: int = 0  # its slices' colour in the GPU bars (palette.lease_color), the table's legend


@dataclass(frozen=True)
class QueueRow:
    position: int
    holder: str
    claim: str
    waited_s: float
    reason: str


@dataclass(frozen=True)
class ReplicaRow:
    """One replica of a job: its state and the last lines of its log."""

    name: str  # role-index
    status: str
    restarts: int
    exit_code: Optional[int]
    log_tail: Tuple[str, ...] = ()


@dataclass(frozen=True)
class JobRow:
    """A job of `gpupool submit` in this pool's state dir (read by the jobs floor, drawn here)."""

    name: str
    phase: str
    message: str
    submitted_at: float
    replicas: Tuple[ReplicaRow, ...] = ()


@dataclass(frozen=True)
class DashboardView:
    """Everything one page shows."""

    node: str
    isolation: str
    now: float
    sampled_at: Optional[float]  # None: no watchdog (embedded pool) or not sampled yet
    nodes: Tuple[NodeRow, ...]
    gpus: Tuple[GpuRow, ...]
    leases: Tuple[LeaseRow, ...]  # at most `lease_limit`, newest first, after the filter
    lease_count: int  # live leases in all
    lease_matches: int  # leases the filter kept
    queue: Tuple[QueueRow, ...]
    queued: int
    actions: Tuple[EnforcementAction, ...]  # newest first
    actions_total: Dict[str, int]
    unleased: Tuple[ProcessUsage, ...]
    query: str
    jobs: Tuple[JobRow, ...] = ()  # newest first
    teams: Tuple[QueueStatus, ...] = ()  # the team queues (gpupool queue set), by name
    period: Period = Period()  # the charts' and usage panel's range, from the lease history

    @property
    def total_mib(self) -> int:
        return sum(n.total_mib for n in self.nodes)

    @property
    def allocated_mib(self) -> int:
        return sum(n.allocated_mib for n in self.nodes)

    @property
    def used_mib(self) -> Optional[int]:
        return None if self.sampled_at is None else sum(n.used_mib or 0 for n in self.nodes)


def job_of_label(label: str) -> str:
    """The job name of a lease label "job/NAME" (the local jobs floor's); "" for any other label."""
    return label[len(JOB_LABEL_PREFIX) :] if label.startswith(JOB_LABEL_PREFIX) else ""


def holder_text(holder: Holder) -> str:
    """How a holder reads in one cell: the pod on Kubernetes, the user of a job, else name@host:pid."""
    namespace, pod = pod_of_label(holder.label)
    if pod:
        return f"{namespace}/{pod}"
    if job_of_label(holder.label):
        return holder.name or "?"  # the pid is the job's supervisor: the job column names what runs
    text = holder.name or "?"
    if holder.host or holder.pid:
        text += f"@{holder.host}:{holder.pid}"
    return text


def build(
    status: PoolStatus,
    now: float,
    queue: Sequence[QueuedClaim] = (),
    query: str = "",
    lease_limit: int = LEASE_LIMIT,
    jobs: Sequence[JobRow] = (),
    period: Period = Period(),
) -> DashboardView:
    """The dashboard of `status` at wall-clock time `now`; `query` filters leases by id, holder or label."""
    usage = status.usage
    devices = sorted(status.devices, key=lambda d: (d.node, d.index, d.uuid))
    by_uuid = {d.uuid: d for d in devices}
    # MiB used per (lease, GPU) and per GPU by processes of no lease, from one pass over the processes
    lease_used: Dict[Tuple[str, str], int] = {}
    lease_used_total: Dict[str, int] = {}
    unleased_mib: Dict[str, int] = {}
    device_used: Dict[str, int] = {}
    device_util: Dict[str, Optional[float]] = {}
    if usage is not None:
        for p in usage.processes:
            if p.lease_id:
                key = (p.lease_id, p.device_uuid)
                lease_used[key] = lease_used.get(key, 0) + p.memory_mib
                lease_used_total[p.lease_id] = lease_used_total.get(p.lease_id, 0) + p.memory_mib
            else:
                unleased_mib[p.device_uuid] = unleased_mib.get(p.device_uuid, 0) + p.memory_mib
        for d in usage.devices:
            device_used[d.uuid] = d.memory_used_mib
            device_util[d.uuid] = d.utilization
    sampled = usage is not None

    segments: Dict[str, List[Segment]] = {d.uuid: [] for d in devices}
    allocated: Dict[str, int] = {}
    for lease in status.leases:
        who = lease.holder.name or "?"
        for s in lease.slices:
            allocated[s.device_uuid] = allocated.get(s.device_uuid, 0) + s.memory_mib
            row = segments.get(s.device_uuid)
            if row is not None:
                used = lease_used.get((lease.id, s.device_uuid), 0) if sampled else None
                row.append(Segment(lease.id, who, s.memory_mib, used))

    gpus = tuple(
        GpuRow(
            d,
            allocated.get(d.uuid, 0),
            device_used.get(d.uuid) if sampled else None,
            unleased_mib.get(d.uuid, 0),
            device_util.get(d.uuid),
            tuple(segments[d.uuid]),
        )
        for d in devices
    )
    return DashboardView(
        node=status.node,
        isolation=status.isolation.mode.value,
        now=now,
        sampled_at=usage.sampled_at if usage is not None else None,
        nodes=_nodes(gpus),
        gpus=gpus,
        leases=_lease_rows(status.leases, by_uuid, lease_used_total if sampled else None, now, query, lease_limit),
        lease_count=len(status.leases),
        lease_matches=sum(1 for lease in status.leases if _matches(lease, query)),
        queue=_queue_rows(queue, status, allocated, now),
        queued=max(status.queued, len(queue)),
        actions=tuple(reversed(usage.actions)) if usage is not None else (),
        actions_total=dict(usage.actions_total) if usage is not None else {},
        unleased=tuple(usage.unleased()) if usage is not None else (),
        query=query,
        jobs=tuple(sorted(jobs, key=lambda j: j.submitted_at, reverse=True)),
        teams=tuple(sorted(status.queues, key=lambda q: q.spec.name)),
        period=period,
    )


def _nodes(gpus: Sequence[GpuRow]) -> Tuple[NodeRow, ...]:
    rows: Dict[str, List[GpuRow]] = {}
    for g in gpus:
        rows.setdefault(g.device.node, []).append(g)
    return tuple(
        NodeRow(
            node,
            len(group),
            sum(1 for g in group if g.device.healthy),
            sum(g.device.memory_mib for g in group),
            sum(g.allocated_mib for g in group),
            None if any(g.used_mib is None for g in group) else sum(g.used_mib or 0 for g in group),
        )
        for node, group in rows.items()
    )


def _matches(lease: Lease, query: str) -> bool:
    if not query:
        return True
    q = query.lower()
    h = lease.holder
    return q in lease.id or q in h.name.lower() or q in h.label.lower() or q in h.host.lower() or q in lease.queue


def _lease_rows(
    leases: Sequence[Lease],
    devices: Dict[str, Device],
    used: Optional[Dict[str, int]],
    now: float,
    query: str,
    limit: int,
) -> Tuple[LeaseRow, ...]:
    kept = [lease for lease in leases if _matches(lease, query)]
    kept.sort(key=lambda lease: lease.created_at, reverse=True)
    rows = []
    for lease in kept[:limit]:
        namespace, pod = pod_of_label(lease.holder.label)
        suspension = lease.suspension
        rows.append(
            LeaseRow(
                lease=lease,
                holder=holder_text(lease.holder),
                namespace=namespace,
                pod=pod,
                share=", ".join(_slice_text(s.device_uuid, s.memory_mib, devices) for s in lease.slices),
                label=lease.holder.label,
                queue=lease.queue,
                job=job_of_label(lease.holder.label),
                color=lease_color(lease.id),
                allocated_mib=sum(s.memory_mib for s in lease.slices),
                used_mib=None if used is None else used.get(lease.id, 0),
                age_s=max(0.0, now - lease.created_at),
                expires_in_s=lease.expires_at - now,
                state=lease.state,
                parked_bytes=suspension.host_bytes if suspension and lease.state in PARKED_STATES else None,
                error=suspension.error if suspension else "",
            )
        )
    return tuple(rows)


def _slice_text(uuid: str, memory_mib: int, devices: Dict[str, Device]) -> str:
    """One slice: where, the fraction of that GPU and its MiB ("node-a/GPU0 50% 8GiB")."""
    d = devices.get(uuid)
    if d is None:
        return f"{uuid} {format_mib(memory_mib)}"
    percent = 100.0 * memory_mib / d.memory_mib if d.memory_mib else 0.0
    return f"{d.node}/GPU{d.index} {percent:.0f}% {format_mib(memory_mib)}"


def _queue_rows(
    queue: Sequence[QueuedClaim], status: PoolStatus, allocated: Dict[str, int], now: float
) -> Tuple[QueueRow, ...]:
    rows = []
    for position, waiting in enumerate(queue):
        if position == 0:
            # The head alone may be granted; it waits for room, and place() says which.
            placement = place(status.devices, allocated, waiting.claim)
            reason = "fits now: granted at its next poll" if placement.fits else placement.reason
        else:
            reason = f"behind {position} earlier claim(s) (FIFO)"
        rows.append(
            QueueRow(
                position + 1,
                holder_text(waiting.holder),
                waiting.claim.describe(),
                max(0.0, now - waiting.queued_at),
                reason,
            )
        )
    return tuple(rows)
