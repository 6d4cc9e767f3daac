"""Admission in a pool with queues: which waiting claim goes next, and whom it preempts.

The rules are core.queues' pure functions; this module reads what they need from
the store inside the caller's transaction and writes the preemptions back. A pool
without queues never comes here (Pool keeps its FIFO fast path).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ...core.errors import GpupoolError, InvalidClaim, Unsatisfiable
from ...core.fragmentation import Fragmentation
from ...core.model import Claim, Device, Holder, Lease, Slice
from ...core.placement import place
from ...core.queues import (
    NO_QUEUE,
    PREEMPT_REAP_MARGIN_S,
    QueueLoad,
    QueueSpec,
    Waiting,
    admission_order,
    admission_split,
    borrowers,
    choose_victims,
    claim_gpus,
    lease_gpus,
    memory_by_uuid,
    next_ticket,
    slices_gpus,
)
from ...core.status import WAIT_BEHIND, WAIT_HELD, WAIT_LIMIT, WAIT_NEXT, WAIT_NO_ROOM, WaitingClaim
from ...core.suspension import BY_PREEMPTION, DEFAULT_PREEMPT_MODE, PREEMPT_SUSPEND, RUNNING, Suspension
from ...logs import get_logger
from ..store.tx import Tx
from .suspend import preempt_by_suspending

if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

    QueueRow = Tuple[int, str, str, float, str, int, str, bool, str]  # Tx.queue_rows

log = get_logger(__name__)

# A claim waiting for leases it preempted polls this long past their reaping, so it sees them gone.
REAP_POLL_MARGIN_S = 1.0


@dataclass
class Decision:
    """What admission decided for one ticket: grant `slices`, or wait for `reason`."""

    slices: Optional[Tuple[Slice, ...]] = None
    reason: str = ""
    preempted: List[Lease] = field(default_factory=list)  # leases this decision preempted
    wait_at_least_s: float = 0.0  # > 0: it waits for preempted leases this long (from now)


def unknown_queue(name: str, specs: Mapping[str, QueueSpec]) -> InvalidClaim:
    known = ", ".join(sorted(specs)) or "none yet"
    return InvalidClaim(
        f"queue {name!r} does not exist (queues: {known}): create it with `gpupool queue set {name} --quota GPUS` "
        "or claim in an existing one"
    )


def check_claim_queue(claim: Claim, specs: Mapping[str, QueueSpec], devices: Sequence[Device]) -> None:
    """InvalidClaim for an unknown queue; Unsatisfiable-like InvalidClaim for a claim over its queue's limit."""
    if claim.queue == NO_QUEUE:
        return
    spec = specs.get(claim.queue)
    if spec is None:
        raise unknown_queue(claim.queue, specs)
    least = claim_gpus(claim, devices)
    if spec.limit is not None and least > spec.limit + 1e-9:
        raise Unsatisfiable(
            f"queue {spec.name!r} may hold at most {spec.limit:g} GPUs, and {claim.describe()} takes {least:g}: "
            f"ask for less, or raise its limit (gpupool queue set {spec.name} --limit GPUS)"
        )


def _loads(specs: Mapping[str, QueueSpec], leases: Sequence[Lease], sizes: Mapping[str, float]) -> Dict[str, QueueLoad]:
    held: Dict[str, float] = {}
    for lease in leases:
        held[lease.queue] = held.get(lease.queue, 0.0) + sizes[lease.id]
    loads = {name: QueueLoad.of(spec, held.get(name, 0.0)) for name, spec in specs.items()}
    loads[NO_QUEUE] = QueueLoad(allocated=held.get(NO_QUEUE, 0.0))
    return loads


def _waiting(tx: Tx, devices: Sequence[Device]) -> List[Waiting]:
    waiting: List[Waiting] = []
    for ticket, queue, priority, claim_json in tx.waiting():
        try:
            gpus = claim_gpus(Claim.from_dict(json.loads(claim_json)), devices)
        except (ValueError, TypeError, KeyError, GpupoolError):
            gpus = 0.0  # a ticket this version cannot read: it still keeps its place
        waiting.append(Waiting(ticket, queue, priority, gpus))
    return waiting


def admit(
    tx: Tx,
    ticket: int,
    claim: Claim,
    specs: Mapping[str, QueueSpec],
    devices: Sequence[Device],
    allocated: Mapping[str, int],
    frag: Optional[Fragmentation],
    now: float,
    default_mode: str = DEFAULT_PREEMPT_MODE,
) -> Decision:
    """Decide for `ticket` (already in the table): grant it if it goes next and fits, else say why.

    Going next and within its queue's quota but short of room, it preempts borrowing
    leases of other queues (core.queues.choose_victims) and waits for them.
    """
    leases = tx.leases()
    memory_of = memory_by_uuid(devices)
    sizes = {x.id: lease_gpus(x, memory_of) for x in leases}
    loads = _loads(specs, leases, sizes)
    waiting = _waiting(tx, devices)
    head = next_ticket(waiting, loads)
    if head is None or head.ticket != ticket:
        return Decision(reason=_behind(ticket, waiting, loads, claim))
    load = loads[claim.queue]
    placement = place(devices, allocated, claim, frag)
    if placement.fits:
        assert placement.slices is not None
        gpus = slices_gpus(placement.slices, memory_of)
        if load.within_limit(gpus):
            return Decision(slices=placement.slices)
        return Decision(reason=_at_limit(claim.queue, load, gpus))
    if claim.queue == NO_QUEUE or not load.within_quota(head.gpus):
        return Decision(reason=placement.reason)
    quotas = {name: spec.quota for name, spec in specs.items()}
    found = choose_victims(
        lambda alloc: place(devices, alloc, claim, frag),
        allocated,
        leases,
        claim.queue,
        borrowers(leases, quotas, sizes),
    )
    if found is None:
        return Decision(reason=placement.reason + "; no borrowed lease of another queue would make room")
    victims, room = found
    assert room.slices is not None
    if not load.within_quota(slices_gpus(room.slices, memory_of)):
        return Decision(reason=placement.reason)  # where it would fit, it would take more than its quota
    preempted = [_preempt(tx, lease, now, claim.queue, _mode(specs, lease, default_mode)) for lease in victims]
    # It waits for the preempted leases, those preempted before it too: each is gone by its expiry
    # at the latest (a preempted lease expires when it is to be reaped, or sooner without heartbeats).
    gone_by = max((x.expires_at for x in list(leases) + preempted if x.preempted_at is not None), default=now)
    return Decision(
        reason=f"waiting for {len(preempted) or 'earlier'} preempted lease(s) of other queues to stop",
        preempted=preempted,
        wait_at_least_s=max(0.0, gone_by - now) + REAP_POLL_MARGIN_S,
    )


def _mode(specs: Mapping[str, QueueSpec], lease: Lease, default_mode: str) -> str:
    """What preempting `lease` does: its queue's mode, else the pool's."""
    spec = specs.get(lease.queue)
    return spec.preempt if spec is not None and spec.preempt else default_mode


def _preempt(tx: Tx, lease: Lease, now: float, for_queue: str, mode: str) -> Lease:
    """Mark `lease` preempted: it is reaped at its grace + PREEMPT_REAP_MARGIN_S unless released (or,
    with the mode suspend, parked) first."""
    expires_at = min(lease.expires_at, now + lease.preempt_grace_s + PREEMPT_REAP_MARGIN_S)
    tx.count_preemption(lease.queue, mode)
    if mode == PREEMPT_SUSPEND:
        log.warning(
            "lease %s of %s (queue %r) suspended for queue %r",
            lease.id,
            lease.holder.describe(),
            lease.queue,
            for_queue,
        )
        return preempt_by_suspending(tx, lease, for_queue, now, expires_at)
    tx.set_lease_preempted(lease.id, now, expires_at)
    # The mode goes with the lease: its runner reruns the command for `requeue`, never for `kill`.
    record = Suspension(RUNNING, BY_PREEMPTION, f"preempted for queue {for_queue!r}", now, False, mode=mode)
    if lease.suspension is not None:
        record = replace(record, suspended_s=lease.suspension.suspended_s, error=lease.suspension.error)
    tx.put_suspension(lease.id, record)
    log.warning(
        "lease %s of %s (queue %r, priority %d) preempted for queue %r: %g s to stop",
        lease.id,
        lease.holder.describe(),
        lease.queue,
        lease.priority,
        for_queue,
        lease.preempt_grace_s,
    )
    return replace(lease, preempted_at=now, expires_at=expires_at, suspension=record)


def _behind(ticket: int, waiting: List[Waiting], loads: Mapping[str, QueueLoad], claim: Claim) -> str:
    order = [w.ticket for w in admission_order(waiting, loads)]
    ahead = order.index(ticket) if ticket in order else len(order)
    load = loads.get(claim.queue)
    mine = next((w for w in waiting if w.ticket == ticket), None)
    if load is not None and mine is not None and not load.within_limit(mine.gpus):
        return _at_limit(claim.queue, load, mine.gpus)
    return f"{ahead} earlier claim(s) are waiting in the queue"


def _at_limit(queue: str, load: QueueLoad, gpus: float) -> str:
    return f"queue {queue!r} holds {load.allocated:g} of its limit {load.limit:g} GPUs and this claim takes {gpus:g}"


def waiting_order(
    tx: Tx,
    rows: Sequence[QueueRow],
    specs: Mapping[str, QueueSpec],
    devices: Sequence[Device],
    allocated: Mapping[str, int],
    frag: Optional[Fragmentation],
) -> List[WaitingClaim]:
    """The waiting claims of `rows` (Tx.queue_rows) in the order the pool grants them, each with why
    it waits: `admission_split`, the order `next_ticket` (which `admit` asks) takes them in, were each
    granted in turn, over the claims not held; then those held (place 0). A pool without queues
    grants by priority, then age (Tx.head_ticket): `next_ticket`'s order for claims of one queue."""
    # Without queues every claim is of no queue, whose order its load does not change: no lease is read.
    leases = tx.leases() if specs else []
    memory_of = memory_by_uuid(devices)
    loads = _loads(specs, leases, {x.id: lease_gpus(x, memory_of) for x in leases})
    claims: Dict[int, Optional[Claim]] = {}
    waiting: List[Waiting] = []
    by_ticket = {row[0]: row for row in rows}
    for ticket, claim_json, _holder, _at, queue, priority, _reason, held, _key in rows:
        try:
            claim: Optional[Claim] = Claim.from_dict(json.loads(claim_json))
            gpus = claim_gpus(claim, devices) if claim is not None else 0.0
        except (ValueError, TypeError, KeyError, GpupoolError):
            claim, gpus = None, 0.0  # a ticket this version cannot read: it still keeps its place
        claims[ticket] = claim
        if not held:
            waiting.append(Waiting(ticket, queue, priority, gpus))
    admitted, held_back = admission_split(waiting, loads)
    over = {w.ticket for w in held_back}
    no_fit = {
        w.ticket: place(devices, allocated, claim, frag).reason
        for w in admitted
        for claim in [claims[w.ticket]]
        if claim is not None
    }
    head = admitted[0] if admitted else None
    shown: List[WaitingClaim] = []
    for position, w in enumerate(admitted + held_back, 1):
        claim = claims[w.ticket]
        if w.ticket in over:
            load = loads.get(w.queue, QueueLoad())
            why, reason = WAIT_LIMIT, "over its queue's limit: " + _at_limit(w.queue, load, w.gpus)
        elif claim is None:
            why, reason = WAIT_NO_ROOM, by_ticket[w.ticket][6]
        else:
            why, reason = _why(head, claims, no_fit, no_fit[w.ticket], position - 1)
        shown.append(_shown(by_ticket[w.ticket], claim, position, why, reason))
    for row in rows:
        if row[7]:
            reason = f"held: skipped by grants until `gpupool claim release {row[0]}`"
            shown.append(_shown(row, claims[row[0]], 0, WAIT_HELD, reason))
    return shown


def _why(
    head: Optional[Waiting],
    claims: Mapping[int, Optional[Claim]],
    no_fits: Mapping[int, str],
    no_fit: str,
    ahead: int,
) -> Tuple[str, str]:
    """(WAIT_REASONS kind, text) of a claim the pool admits in turn, `ahead` claims after `head`;
    `no_fit` is why it does not fit now ('' when it does), `no_fits` the same of the others."""
    if ahead == 0 or head is None:
        if not no_fit:
            return WAIT_NEXT, "goes next: there is room now, it is granted at its next poll"
        return WAIT_NO_ROOM, f"no room: {no_fit}"
    if no_fit:
        return WAIT_NO_ROOM, f"no room: {no_fit}; {ahead} claim(s) go first"
    first = claims.get(head.ticket)
    what = first.describe() if first is not None else "a claim"
    if no_fits.get(head.ticket):  # it would fit, but the head does not: the room is kept for the head
        return WAIT_BEHIND, f"behind a larger claim: ticket {head.ticket} ({what}) goes first, the room is kept for it"
    return WAIT_BEHIND, f"behind ticket {head.ticket} ({what}), granted first; {ahead} claim(s) go first"


def _shown(row: QueueRow, claim: Optional[Claim], position: int, why: str, reason: str) -> WaitingClaim:
    ticket, _claim, holder_json, created_at, queue, priority, _reason, held, _key = row
    try:
        holder = Holder.from_dict(json.loads(holder_json), recorded=True)
    except (ValueError, TypeError, KeyError, GpupoolError):
        holder = Holder()
    described = claim.describe() if claim is not None else "(a claim this version cannot read)"
    return WaitingClaim(
        position, ticket, queue, priority, described, holder.name, holder.label, created_at, reason, held, why
    )
