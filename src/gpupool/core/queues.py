"""Queues: quotas, borrowing by weight, the order of waiting claims, victims of preemption, usage.

Pure rules over plain values; the pool (pool/queues.py) reads the store and applies them.

Units: a GPU of quota is one whole device's worth, so a lease's size in GPUs is
the sum of its slices' MiB over their devices' MiB. A queue *borrows* the part of
what it holds beyond its quota: order its live leases by (priority desc, created_at
asc); the leases whose cumulative size passes the quota are its borrowed ones.
Claims with no queue ("") belong to no queue: quota 0, weight 1, always borrowing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import InvalidInput
from .model import DEFAULT_PREEMPT_GRACE_S as DEFAULT_PREEMPT_GRACE_S  # the one default, defined with Lease
from .model import MAX_TIME_LIMIT_S, MIN_TIME_LIMIT_S, Claim, Device, Holder, Lease, Slice, check_idle, check_queue_name
from .model import PREEMPT_REAP_MARGIN_S as PREEMPT_REAP_MARGIN_S  # with reap_at, beside Lease: the run path reads it
from .model import reap_at as reap_at
from .quantity import format_duration
from .suspension import PREEMPT_MODES, PREEMPTED_AS, check_preempt_mode

if TYPE_CHECKING:  # types only: a run against a server reads QueueStatus and never places anything
    from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

    from .placement import Placement
    from .suspension import ParkedSlice

    Placer = Callable[[Mapping[str, int]], Placement]

NO_QUEUE = ""
# Quotas and limits above this many GPUs are typos, not pools.
MAX_QUEUE_GPUS = 1_000_000.0
MAX_WEIGHT = 1_000_000.0
# GPU sizes add up in floating point (three thirds of a GPU): comparisons allow this much.
EPSILON = 1e-9
USAGE_KEYS = ("queue", "holder", "label")


def _time(value: object, what: str, name: str) -> float:
    """A queue's time limit in seconds within `gpupool run --time`'s range, else InvalidInput."""
    fix = "give a duration such as 2h or 30m"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"queue {name!r}: {what} {value!r} is not a number of seconds: {fix}")
    if not MIN_TIME_LIMIT_S <= value <= MAX_TIME_LIMIT_S:
        raise InvalidInput(
            f"queue {name!r}: {what} {value!r} must be between {MIN_TIME_LIMIT_S:g} and {MAX_TIME_LIMIT_S:g} seconds: {fix}"
        )
    return float(value)


def _gpus(value: object, what: str, name: str, fix: str) -> float:
    """`value` as a finite, non-negative number of GPUs at most MAX_QUEUE_GPUS, else InvalidInput."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"queue {name!r}: {what} {value!r} is not a number: {fix}")
    number = float(value)
    if not math.isfinite(number) or not 0 <= number <= MAX_QUEUE_GPUS:
        raise InvalidInput(f"queue {name!r}: {what} {value!r} is out of range [0, {MAX_QUEUE_GPUS:g}]: {fix}")
    return number


@dataclass(frozen=True)
class QueuedClaim:
    """A claim waiting in the pool's FIFO queue (`Pool.tickets.queue()`), with when it joined (here, not in
    core.model: only views and metrics list waiting claims, and a run does not load this module)."""

    ticket: int
    claim: Claim
    holder: Holder
    queued_at: float


QUEUE_FIELDS = ("name", "quota", "weight", "limit", "preempt", "idle_suspend_s", "default_time_s", "max_time_s")


@dataclass(frozen=True)
class QueueSpec:
    """A queue: `quota` GPUs guaranteed, idle ones borrowed by `weight`, at most `limit` held."""

    name: str
    quota: float
    weight: float = 1.0
    limit: Optional[float] = None  # None: no cap on what it may borrow
    preempt: str = ""  # what preempting its borrowing leases does (core.suspension.PREEMPT_MODES); '' = the pool's
    idle_suspend_s: Optional[float] = (
        None  # suspend its leases idle this long (a claim's own limit wins); None: the node's
    )
    # The wall-time limit of its runs (`gpupool run --time`), as a Slurm partition's DefaultTime and
    # MaxTime: a run without --time gets the default (else the maximum); a --time above the maximum
    # is refused. None: no default, no maximum.
    default_time_s: Optional[float] = None
    max_time_s: Optional[float] = None

    def __post_init__(self) -> None:
        check_queue_name(self.name, InvalidInput)
        for what, value in (("default time", self.default_time_s), ("max time", self.max_time_s)):
            if value is not None:
                object.__setattr__(self, what.replace(" ", "_") + "_s", _time(value, what, self.name))
        if self.default_time_s is not None and self.max_time_s is not None and self.default_time_s > self.max_time_s:
            raise InvalidInput(
                f"queue {self.name!r}: default time {format_duration(self.default_time_s)} is above its max time "
                f"{format_duration(self.max_time_s)}: give --default-time of at most --max-time"
            )
        if self.preempt:
            check_preempt_mode(self.preempt, f"queue {self.name!r}: preempt")
        if self.idle_suspend_s is not None:
            object.__setattr__(self, "idle_suspend_s", check_idle(self.idle_suspend_s, InvalidInput))
        object.__setattr__(self, "quota", _gpus(self.quota, "quota", self.name, "give GPUs, e.g. --quota 1.5"))
        weight = _gpus(self.weight, "weight", self.name, "give a positive number, e.g. --weight 2")
        if not 0 < weight <= MAX_WEIGHT:
            raise InvalidInput(
                f"queue {self.name!r}: weight {self.weight!r} must be above 0 and at most {MAX_WEIGHT:g}: "
                "give a positive number, e.g. --weight 2"
            )
        object.__setattr__(self, "weight", weight)
        if self.limit is not None:
            limit = _gpus(self.limit, "limit", self.name, "give GPUs at least the quota, e.g. --limit 4")
            if limit + EPSILON < self.quota:
                raise InvalidInput(
                    f"queue {self.name!r}: limit {self.limit!r} is below its quota {self.quota:g}: "
                    f"give --limit of at least {self.quota:g} GPUs, or none"
                )
            object.__setattr__(self, "limit", limit)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "quota": self.quota,
            "weight": self.weight,
            "limit": self.limit,
            "preempt": self.preempt,
            "idle_suspend_s": self.idle_suspend_s,
            "default_time_s": self.default_time_s,
            "max_time_s": self.max_time_s,
        }

    def time_limit(self, asked: Optional[float]) -> Optional[float]:
        """A run's wall-time limit in this queue: `asked` (its --time) up to the maximum, else the
        default, else the maximum; a --time above the maximum is InvalidInput naming both."""
        if asked is None:
            return self.default_time_s if self.default_time_s is not None else self.max_time_s
        if self.max_time_s is not None and asked > self.max_time_s:
            most = format_duration(self.max_time_s)
            raise InvalidInput(
                f"--time {format_duration(asked)} is above queue {self.name}'s max time {most}: give --time {most} or less"
            )
        return asked

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QueueSpec:
        if not isinstance(data, Mapping):
            raise InvalidInput(f"a queue must be an object with name and quota, got {data!r}")
        unknown = set(data) - set(QUEUE_FIELDS)
        if unknown:
            raise InvalidInput(f"unknown queue field(s) {sorted(unknown)}: a queue has {', '.join(QUEUE_FIELDS)}")
        if "quota" not in data:
            raise InvalidInput(f"queue {data.get('name')!r} has no quota: give GPUs, e.g. --quota 1")
        weight = data.get("weight")
        return cls(
            name=data.get("name"),  # type: ignore[arg-type]  # checked by __post_init__
            quota=data["quota"],
            weight=1.0 if weight is None else weight,
            limit=data.get("limit"),
            preempt=str(data.get("preempt") or ""),
            idle_suspend_s=data.get("idle_suspend_s"),
            default_time_s=data.get("default_time_s"),
            max_time_s=data.get("max_time_s"),
        )


@dataclass(frozen=True)
class QueueStatus:
    """A queue with what it holds now: what `gpupool queue list` and status show."""

    spec: QueueSpec
    allocated: float  # GPUs held by live leases
    borrowed: float  # the part of allocated beyond the quota
    waiting: int  # claims queued
    preemptions: int  # leases of this queue preempted, ever, in every mode
    # Of those, how many per mode (core.suspension.PREEMPT_MODES), each mode listed.
    preempted: Mapping[str, int] = field(default_factory=dict)
    preempt_in_force: str = ""  # the mode its borrowers are preempted by: its own, else the pool's

    def to_dict(self) -> Dict[str, Any]:
        return dict(
            self.spec.to_dict(),
            allocated=round(self.allocated, 6),
            borrowed=round(self.borrowed, 6),
            waiting=self.waiting,
            preemptions=self.preemptions,
            preempted={mode: int(self.preempted.get(mode, 0)) for mode in PREEMPT_MODES},
            preempt_in_force=self.preempt_in_force or self.spec.preempt,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QueueStatus:
        spec = QueueSpec.from_dict({k: data[k] for k in QUEUE_FIELDS if k in data})
        return cls(
            spec,
            float(data.get("allocated", 0.0)),
            float(data.get("borrowed", 0.0)),
            int(data.get("waiting", 0)),
            int(data.get("preemptions", 0)),
            {str(k): int(v) for k, v in dict(data.get("preempted") or {}).items() if k in PREEMPT_MODES and int(v)},
            str(data.get("preempt_in_force") or ""),
        )


@dataclass(frozen=True)
class UsageRow:
    """GPU-seconds used by one queue, holder or label over a window."""

    key: str  # "" shown as "-"
    gpu_seconds: float
    leases: int

    def to_dict(self) -> Dict[str, Any]:
        return {
            "key": self.key or "-",
            "gpu_seconds": round(self.gpu_seconds, 3),
            "gpu_hours": round(self.gpu_seconds / 3600.0, 6),
            "leases": self.leases,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UsageRow:
        key = str(data.get("key", ""))
        return cls("" if key == "-" else key, float(data.get("gpu_seconds", 0.0)), int(data.get("leases", 0)))


@dataclass(frozen=True)
class LeaseRecord:
    """One lease that ended, as `gpupool usage --by lease` lists it (Slurm's sacct, for leases)."""

    lease_id: str
    holder: str
    label: str
    queue: str
    gpus: float  # its share in GPUs (0.5 = half of one GPU's memory)
    started_at: float
    ended_at: float
    reason: str  # how it ended: store.schema.HISTORY_REASONS
    suspended_s: float = 0.0  # of its span, parked (not GPU time)
    exit_code: Optional[int] = None  # its command's, as its runner said at release (a label); None: not said
    ended_by: str = ""  # who ended it: "owner" or "admin" (a release, a revocation); "": nobody (an expiry)
    preempt_mode: str = ""  # how it was last preempted (core.suspension.PREEMPT_MODES); "": never

    @property
    def state(self) -> str:
        """How it ended as sacct says it: its reason, or preempted/suspended (requeued, killed) for a
        lease a preemption stopped or parked."""
        past = PREEMPTED_AS.get(self.preempt_mode)
        return f"preempted/{past}" if past else self.reason

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * max(0.0, self.ended_at - self.started_at - self.suspended_s)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "lease": self.lease_id,
            "holder": self.holder,
            "label": self.label,
            "queue": self.queue,
            "gpus": round(self.gpus, 6),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "elapsed_s": round(self.ended_at - self.started_at, 3),
            "suspended_s": round(self.suspended_s, 3),
            "gpu_seconds": round(self.gpu_seconds, 3),
            "ended": self.reason,
            "exit_code": self.exit_code,
            "ended_by": self.ended_by,
            "preempted": self.preempt_mode,
            "state": self.state,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeaseRecord:
        return cls(
            str(data["lease"]),
            str(data.get("holder", "")),
            str(data.get("label", "")),
            str(data.get("queue", "")),
            float(data.get("gpus", 0.0)),
            float(data["started_at"]),
            float(data["ended_at"]),
            str(data.get("ended", "")),
            float(data.get("suspended_s", 0.0)),
            None if data.get("exit_code") is None else int(data["exit_code"]),
            str(data.get("ended_by", "")),
            str(data.get("preempted") or ""),
        )


def check_usage_key(by: object) -> str:
    if by not in USAGE_KEYS:
        raise InvalidInput(f"usage by {by!r} is unknown: use one of {', '.join(USAGE_KEYS)}")
    return str(by)


# A window's `since` below this is "seconds ago", at or above it epoch seconds (2001-09-09: no pool is older).
EPOCH_SINCE = 1e9


def query_since(text: str, now: float) -> float:
    """A query's `since` as epoch seconds: a value under EPOCH_SINCE counts back from `now`."""
    value = query_seconds("since", text)
    if value < 0:
        raise InvalidInput(f"since {text!r} must be seconds ago (e.g. 86400) or epoch seconds, not negative")
    return now - value if value < EPOCH_SINCE else value


def query_seconds(name: str, text: str) -> float:
    """A query's field `name` as a finite number of seconds; InvalidInput names it otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidInput(f"{name} {text!r} must be a finite number of seconds")
    return value


def check_quotas_fit(specs: Iterable[QueueSpec], pool_gpus: float) -> None:
    """InvalidInput when the quotas add up to more GPUs than the pool has: they could not all hold."""
    specs = list(specs)
    total = sum(s.quota for s in specs)
    if total > pool_gpus + EPSILON:
        listed = ", ".join(f"{s.name} {s.quota:g}" for s in specs)
        raise InvalidInput(
            f"queue quotas would sum to {total:g} GPUs ({listed}) but the pool has {pool_gpus:g}: "
            "lower a quota (gpupool queue set NAME --quota GPUS) or delete a queue"
        )


# --- sizes ---------------------------------------------------------------------
def memory_by_uuid(devices: Iterable[Device]) -> Dict[str, int]:
    return {d.uuid: d.memory_mib for d in devices}


def slices_gpus(slices: Iterable[Union[Slice, ParkedSlice]], memory_of: Mapping[str, int]) -> float:
    """GPUs' worth of `slices`; a slice on a device that is gone counts as a whole GPU."""
    total = 0.0
    for s in slices:
        memory = memory_of.get(s.device_uuid, 0)
        total += s.memory_mib / memory if memory > 0 else 1.0
    return total


def lease_gpus(lease: Lease, memory_of: Mapping[str, int]) -> float:
    return slices_gpus(lease.slices, memory_of)


def used_gpus(lease: Lease, memory_of: Mapping[str, int]) -> float:
    """GPUs' worth a lease is accounted for: its slices, or those it parked while it holds none
    (suspended); the seconds it is suspended are taken off apart (UsageSpan.suspended_s)."""
    if lease.slices or lease.suspension is None:
        return lease_gpus(lease, memory_of)
    return slices_gpus(lease.suspension.parked, memory_of)


def claim_gpus(claim: Claim, devices: Sequence[Device]) -> float:
    """The least GPUs' worth `claim` can take: fractions as given, MiB over the largest device
    that accepts them (placement may choose a smaller one, and then it takes more)."""
    total = 0.0
    for request in claim.requests:
        if request.fraction is not None:
            total += request.count * request.fraction
            continue
        assert request.memory_mib is not None
        largest = max((d.memory_mib for d in devices if request.accepts(d)), default=0)
        total += request.count * (min(1.0, request.memory_mib / largest) if largest > 0 else 1.0)
    return total


# --- borrowing -----------------------------------------------------------------
def quota_order(leases: Iterable[Lease]) -> List[Lease]:
    """A queue's leases in the order they count against its quota: priority desc, oldest first."""
    return sorted(leases, key=lambda x: (-x.priority, x.created_at, x.id))


def borrowed_ids(leases: Iterable[Lease], quota: float, sizes: Mapping[str, float]) -> Set[str]:
    """Ids of the leases of one queue that borrow: those whose cumulative size passes `quota`."""
    held = 0.0
    borrowed: Set[str] = set()
    for lease in quota_order(leases):
        held += sizes[lease.id]
        if held > quota + EPSILON:
            borrowed.add(lease.id)
    return borrowed


def borrowers(leases: Sequence[Lease], quotas: Mapping[str, float], sizes: Mapping[str, float]) -> Set[str]:
    """Ids of every borrowing lease of the pool; `quotas` by queue name (a missing queue: quota 0)."""
    by_queue: Dict[str, List[Lease]] = {}
    for lease in leases:
        by_queue.setdefault(lease.queue, []).append(lease)
    found: Set[str] = set()
    for queue, held in by_queue.items():
        found |= borrowed_ids(held, quotas.get(queue, 0.0), sizes)
    return found


# --- admission order -----------------------------------------------------------
@dataclass(frozen=True)
class QueueLoad:
    """What the admission order needs of a queue: its spec's numbers and the GPUs it holds."""

    quota: float = 0.0
    weight: float = 1.0
    limit: Optional[float] = None
    allocated: float = 0.0

    @classmethod
    def of(cls, spec: QueueSpec, allocated: float) -> QueueLoad:
        return cls(spec.quota, spec.weight, spec.limit, allocated)

    def within_quota(self, gpus: float) -> bool:
        return self.allocated + gpus <= self.quota + EPSILON

    def within_limit(self, gpus: float) -> bool:
        return self.limit is None or self.allocated + gpus <= self.limit + EPSILON


NO_QUEUE_LOAD = QueueLoad()


@dataclass(frozen=True)
class Waiting:
    """A waiting claim as the admission order sees it."""

    ticket: int
    queue: str
    priority: int
    gpus: float  # claim_gpus of its claim


def queue_heads(waiting: Iterable[Waiting]) -> Dict[str, Waiting]:
    """The next claim of each queue: highest priority, then first come."""
    heads: Dict[str, Waiting] = {}
    for w in waiting:
        head = heads.get(w.queue)
        if head is None or (-w.priority, w.ticket) < (-head.priority, head.ticket):
            heads[w.queue] = w
    return heads


def next_ticket(waiting: Iterable[Waiting], loads: Mapping[str, QueueLoad]) -> Optional[Waiting]:
    """The one waiting claim the pool may grant next (None when every queue is at its limit).

    Queues whose head fits within their quota come first (first come among them); then
    idle capacity goes to the queue holding the least per weight (weighted max-min).
    A queue whose head would pass its limit is passed over until it holds less.
    """
    best: Optional[Tuple[Tuple[float, ...], Waiting]] = None
    for queue, head in queue_heads(waiting).items():
        load = loads.get(queue, NO_QUEUE_LOAD)
        if not load.within_limit(head.gpus):
            continue
        if load.within_quota(head.gpus):
            key: Tuple[float, ...] = (0, 0.0, head.ticket)
        else:
            key = (1, load.allocated / load.weight, head.ticket)
        if best is None or key < best[0]:
            best = (key, head)
    return best[1] if best else None


def admission_order(waiting: Sequence[Waiting], loads: Mapping[str, QueueLoad]) -> List[Waiting]:
    """Every waiting claim in the order `next_ticket` would admit them, were each granted in turn;
    those of queues that would pass their limit last, by queue order."""
    admitted, held_back = admission_split(waiting, loads)
    return admitted + held_back


def admission_split(waiting: Sequence[Waiting], loads: Mapping[str, QueueLoad]) -> Tuple[List[Waiting], List[Waiting]]:
    """`admission_order` in two: the claims `next_ticket` admits in turn, were each granted, and
    those it then never takes because their queue would pass its limit (by queue order)."""
    loads = dict(loads)
    left = list(waiting)
    order: List[Waiting] = []
    while left:
        chosen = next_ticket(left, loads)
        if chosen is None:
            break
        order.append(chosen)
        left.remove(chosen)
        load = loads.get(chosen.queue, NO_QUEUE_LOAD)
        loads[chosen.queue] = QueueLoad(load.quota, load.weight, load.limit, load.allocated + chosen.gpus)
    return order, sorted(left, key=lambda w: (-w.priority, w.ticket))


# --- preemption ----------------------------------------------------------------


def victim_order(candidates: Iterable[Lease]) -> List[Lease]:
    """Preemption order among borrowing leases: lowest priority first, then the youngest."""
    return sorted(candidates, key=lambda x: (x.priority, -x.created_at, x.id))


def choose_victims(
    place_with: Placer,
    allocated: Mapping[str, int],
    leases: Sequence[Lease],
    claimant_queue: str,
    borrowing: Set[str],
) -> Optional[Tuple[List[Lease], Placement]]:
    """The fewest further leases to preempt so that the claim fits, and the placement it then gets.

    `place_with(allocated)` places the claim against an allocation. Leases already
    preempted count as gone (they are on their way out). Candidates are the borrowing
    leases of other queues, taken in `victim_order` until the claim fits; then each
    one, highest priority first, is spared again if the claim fits without it.
    None when even every candidate would not make room.
    """
    free = dict(allocated)

    def remove(lease: Lease, sign: int = -1) -> None:
        for s in lease.slices:
            free[s.device_uuid] = free.get(s.device_uuid, 0) + sign * s.memory_mib

    for lease in leases:
        if lease.preempted_at is not None:
            remove(lease)
    placement = place_with(free)
    if placement.fits:
        return [], placement
    candidates = victim_order(
        x for x in leases if x.preempted_at is None and x.id in borrowing and x.queue != claimant_queue
    )
    chosen: List[Lease] = []
    for lease in candidates:
        remove(lease)
        chosen.append(lease)
        placement = place_with(free)
        if placement.fits:
            break
    else:
        return None
    for lease in reversed(list(chosen)):
        remove(lease, +1)
        trial = place_with(free)
        if trial.fits:
            chosen.remove(lease)
            placement = trial
        else:
            remove(lease)
    return chosen, placement


# --- status and accounting ------------------------------------------------------
def queue_statuses(
    specs: Iterable[QueueSpec],
    leases: Sequence[Lease],
    devices: Sequence[Device],
    waiting: Mapping[str, int],
    preemptions: Mapping[str, Mapping[str, int]],
    default_mode: str = "",
) -> List[QueueStatus]:
    """Each queue with the GPUs its live leases hold, the part borrowed, its waiting claims."""
    memory_of = memory_by_uuid(devices)
    held: Dict[str, float] = {}
    for lease in leases:
        held[lease.queue] = held.get(lease.queue, 0.0) + lease_gpus(lease, memory_of)
    out: List[QueueStatus] = []
    for spec in sorted(specs, key=lambda s: s.name):
        allocated = held.get(spec.name, 0.0)
        out.append(
            QueueStatus(
                spec,
                allocated,
                max(0.0, allocated - spec.quota),
                waiting.get(spec.name, 0),
                sum(preemptions.get(spec.name, {}).values()),
                dict(preemptions.get(spec.name, {})),
                spec.preempt or default_mode,
            )
        )
    return out


@dataclass(frozen=True)
class UsageSpan:
    """One lease's use of the pool: its keys, its size, from `start` to `end` (None: still held)."""

    queue: str
    holder: str
    label: str
    gpus: float
    start: float
    end: Optional[float]
    suspended_s: float = 0.0  # seconds of the span it was suspended: not GPU time

    def key(self, by: str) -> str:
        return {"queue": self.queue, "holder": self.holder, "label": self.label}[by]


def _running_share(span: UsageSpan, until: float) -> float:
    """The share of `span` it was not suspended. When in the span it was suspended is not kept,
    so a window that clips the span takes its suspended seconds in proportion (a whole span: exactly)."""
    whole = (until if span.end is None else span.end) - span.start
    if span.suspended_s <= 0 or whole <= 0:
        return 1.0
    return max(0.0, 1.0 - span.suspended_s / whole)


def usage_rows(spans: Iterable[UsageSpan], since: float, until: float, by: str) -> List[UsageRow]:
    """GPU-seconds of `spans` clipped to [since, until], summed by `by`; most used first."""
    check_usage_key(by)
    seconds: Dict[str, float] = {}
    counts: Dict[str, int] = {}
    for span in spans:
        end = until if span.end is None else min(span.end, until)
        if end < since or span.start > until:
            continue  # outside the window
        overlap = end - max(span.start, since)
        key = span.key(by)
        seconds[key] = seconds.get(key, 0.0) + max(0.0, overlap) * span.gpus * _running_share(span, until)
        counts[key] = counts.get(key, 0) + 1
    return sorted((UsageRow(k, seconds[k], counts[k]) for k in seconds), key=lambda r: (-r.gpu_seconds, r.key))


__all__ = [
    "QueuedClaim",
    "DEFAULT_PREEMPT_GRACE_S",
    "PREEMPT_REAP_MARGIN_S",
    "NO_QUEUE",
    "USAGE_KEYS",
    "QueueSpec",
    "QueueStatus",
    "UsageRow",
    "UsageSpan",
    "QueueLoad",
    "Waiting",
    "admission_order",
    "next_ticket",
    "borrowed_ids",
    "borrowers",
    "choose_victims",
    "claim_gpus",
    "lease_gpus",
    "used_gpus",
    "slices_gpus",
    "queue_statuses",
    "usage_rows",
    "reap_at",
    "check_quotas_fit",
    "check_usage_key",
]
