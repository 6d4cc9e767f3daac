"""The pool's side of suspend and resume: each step of core/suspension.py's walk in the caller's
transaction. The node's side (park and restore the processes) is the runner's, with
isolation/parking.py; it reports each step back here.

A suspended lease gives its slices back (the rows go; `parked` keeps what they were) and keeps
its expiry, renewed by its runner's heartbeats like any lease: a runner killed while its lease
is suspended lets the lease expire, and nothing of it is left on a GPU.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput
from ...core.model import RESUMING, RUNNING, SUSPENDED, SUSPENDING, Device, Lease
from ...core.resumption import back_in_place, park, remap_of, resume_claim, same_gpus
from ...core.suspension import BY_ADMIN, BY_OWNER, BY_PREEMPTION, PREEMPT_REQUEUE, PREEMPT_SUSPEND, Suspension, one_line
from ...logs import get_logger
from .tickets import TICKET_TTL_S, take_ticket

if TYPE_CHECKING:
    from typing import Callable, Mapping, Optional, Sequence, Tuple

    from ...core.model import Claim, Slice
    from ..store.tx import Tx
    from .ledger import Ledger, View
    from .watch import Watch

    # (ticket, claim) -> the slices admission grants it now, or None (it waits)
    Admit = Callable[[int, Claim], Optional[Tuple[Slice, ...]]]

log = get_logger(__name__)


def ask(tx: Tx, lease: Lease, by: str, reason: str, want_resume: bool, now: float, mode: str = "") -> Lease:
    """Ask `lease`'s runner to park it (state suspending); InvalidInput unless it is running."""
    if lease.state != RUNNING or lease.preempted_at is not None:
        what = "preempted" if lease.preempted_at is not None else lease.state
        raise InvalidInput(f"lease {lease.id} is {what}, not running: only a running lease can be suspended")
    before = lease.suspension
    suspension = Suspension(
        SUSPENDING,
        by,
        one_line(reason),
        now,
        want_resume,
        suspended_s=0.0 if before is None else before.suspended_s,
        mode=mode,
    )
    tx.put_suspension(lease.id, suspension)
    log.info("lease %s: suspend asked (%s)", lease.id, suspension.reason)
    return replace(lease, suspension=suspension)


def preempt_by_suspending(tx: Tx, lease: Lease, for_queue: str, now: float, expires_at: float) -> Lease:
    """A victim of admission in a queue whose preemption suspends: marked preempted (so admission
    waits for its memory and picks no other victim for it) and asked to park; once parked it is
    no longer preempted and waits for room to resume."""
    tx.set_lease_preempted(lease.id, now, expires_at)
    asked = ask(
        tx,
        replace(lease, preempted_at=None),
        BY_PREEMPTION,
        f"preempted for queue {for_queue!r}",
        True,
        now,
        PREEMPT_SUSPEND,
    )
    return replace(asked, preempted_at=now, expires_at=expires_at)


def parked(tx: Tx, lease: Lease, devices: Sequence[Device], host_bytes: int, now: float) -> Lease:
    """The runner parked the lease: its memory goes back to the pool; it stays, suspended."""
    suspension = _expect(lease, SUSPENDING, "report it suspended")
    done = replace(
        suspension,
        state=SUSPENDED,
        since=now,
        parked=park(lease.slices, devices),
        host_bytes=max(0, int(host_bytes)),
        error="",
    )
    tx.put_suspension(lease.id, done)
    tx.set_slices(lease.id, ())
    expires_at = now + lease.ttl_s
    tx.set_lease_expiry(lease.id, expires_at, undo_preemption=True)  # a parked victim is no longer on its way out
    log.info(
        "lease %s suspended: %d MiB given back, %d bytes parked in host memory",
        lease.id,
        sum(s.memory_mib for s in lease.slices),
        done.host_bytes,
    )
    return replace(lease, slices=(), preempted_at=None, expires_at=expires_at, suspension=done)


def park_failed(tx: Tx, lease: Lease, error: str, now: float) -> Lease:
    """The runner could not park the lease: it runs on, with the error; a preemption's victim stays
    preempted and falls back to the mode requeue (its runner stops the command and queues again)."""
    suspension = _expect(lease, SUSPENDING, "report a failed suspend of it")
    note, mode = one_line(error), suspension.mode
    if lease.preempted_at is not None:
        note, mode = f"{note}; preempted by requeueing the command instead", PREEMPT_REQUEUE
        if suspension.mode != PREEMPT_REQUEUE:  # counted as the mode it fell back to
            tx.count_preemption(lease.queue, suspension.mode or PREEMPT_SUSPEND, -1)
            tx.count_preemption(lease.queue, PREEMPT_REQUEUE)
    back = replace(suspension, state=RUNNING, since=now, error=note, mode=mode)
    tx.put_suspension(lease.id, back)
    log.warning("lease %s: suspend failed: %s", lease.id, note)
    return replace(lease, suspension=back)


def want_resume(tx: Tx, lease: Lease, now: float) -> Lease:
    """`gpupool resume`: a suspended lease takes room again as soon as there is some."""
    suspension = _expect(lease, SUSPENDED, "resume it")
    wanted = replace(suspension, want_resume=True, error="")  # a new try: the last failure is history
    tx.put_suspension(lease.id, wanted)
    return replace(lease, suspension=wanted)


def try_place(
    tx: Tx,
    lease: Lease,
    devices: Sequence[Device],
    allocated: Mapping[str, int],
    admit: Admit,
    ticket_for: Callable[[Claim], int],
    now: float,
    ticket_ttl_s: float,
) -> Optional[Lease]:
    """Room again for a suspended lease that wants it, as a claim of its queue would get it (its
    ticket keeps its place, ahead of later claims): the lease resuming on its slices, else None."""
    suspension = lease.suspension
    if suspension is None or suspension.state != SUSPENDED or not suspension.want_resume:
        return None
    claim = resume_claim(suspension.parked, lease.queue, lease.priority)
    ticket = suspension.ticket
    if ticket is None or not tx.refresh_ticket(ticket, now + ticket_ttl_s):
        ticket = ticket_for(claim)
        suspension = replace(suspension, ticket=ticket)
        tx.put_suspension(lease.id, suspension)
    slices = admit(ticket, claim)
    if slices is None:
        return None
    if same_gpus(suspension.parked, devices, allocated):
        slices = back_in_place(suspension.parked)  # where the same GPUs have room, stay on them
    tx.delete_ticket(ticket)
    resuming = replace(suspension, state=RESUMING, ticket=None, remap=remap_of(suspension.parked, slices))
    tx.put_suspension(lease.id, resuming)
    tx.set_slices(lease.id, slices)
    log.info("lease %s: room again on %s", lease.id, ", ".join(s.device_uuid for s in slices))
    return replace(lease, slices=tuple(slices), suspension=resuming)


def restored(tx: Tx, lease: Lease, now: float) -> Lease:
    """The runner restored the lease: it runs again (the record keeps its suspended seconds)."""
    suspension = _expect(lease, RESUMING, "report it resumed")
    back = replace(
        suspension,
        state=RUNNING,
        since=now,
        suspended_s=suspension.suspended_seconds(now),
        remap=(),
        parked=(),
        error="",
    )
    tx.put_suspension(lease.id, back)
    log.info("lease %s resumed after %.1f s suspended", lease.id, back.suspended_s - suspension.suspended_s)
    return replace(lease, suspension=back)


def restore_failed(tx: Tx, lease: Lease, error: str, now: float) -> Lease:
    """The runner could not restore the lease: it stays suspended, with the error, and gives its new
    slices back; it waits for `gpupool resume` (not for room again: that could fail the same way)."""
    suspension = _expect(lease, RESUMING, "report a failed resume of it")
    back = replace(suspension, state=SUSPENDED, remap=(), want_resume=False, error=one_line(error))
    tx.put_suspension(lease.id, back)
    tx.set_slices(lease.id, ())
    log.warning("lease %s: resume failed, still suspended: %s", lease.id, back.error)
    return replace(lease, slices=(), suspension=back)


def _expect(lease: Lease, state: str, verb: str) -> Suspension:
    if lease.suspension is None or lease.suspension.state != state:
        raise InvalidInput(f"lease {lease.id} is {lease.state}, not {state}: cannot {verb}")
    return lease.suspension


class Suspensions:
    """The verbs of suspension, each one transaction of the steps above: suspend, resume, and the
    runner's reports; and `place_waiting`, the resume placement, run at the end of every write."""

    def __init__(self, ledger: Ledger, watch: Watch) -> None:
        self.ledger = ledger
        self.watch = watch
        ledger.after_write = self.place_waiting

    def place_waiting(self, tx: Tx, view: View) -> None:
        """Room again for the suspended leases that want it, oldest suspension first, as admission
        gives it to claims, in the caller's write: a release, a parking, an expiry, a claim given up
        or granted, a heartbeat may let one in. Its commit wakes the lease's watch (pool/notify.py)."""
        if view.tickets == 0:
            return  # every lease that wants room holds a ticket (`resume` and a parking say None: ask)
        waiting = tx.suspensions(SUSPENDED)
        if not waiting:
            return
        now = self.ledger.clock()
        if not view.valid:  # this write moved slices the view does not follow: count them again
            view.allocated = tx.allocated()
        claims = self.watch.claims
        for lease_id in waiting:
            lease = tx.get_lease(lease_id)
            if lease is None or lease.suspension is None or not lease.suspension.want_resume:
                continue
            holder = lease.holder
            placed = try_place(
                tx,
                lease,
                view.devices,
                view.allocated,
                lambda ticket, claim: claims.room_for(tx, view, ticket, claim, now),
                lambda claim: take_ticket(tx, claim, holder, self.ledger.host, now, pid=0),  # noqa: B023
                now,
                TICKET_TTL_S,
            )
            view.tickets = None
            if placed is not None:
                for sl in placed.slices:
                    view.allocated[sl.device_uuid] = view.allocated.get(sl.device_uuid, 0) + sl.memory_mib
                view.invalidate()  # admission may have written more than the view follows

    def suspend(self, lease_id: str, requester: Optional[str] = None, reason: str = "", by: str = "") -> Lease:
        """Ask the lease's runner to park it (holder or admin; `requester` None acts as admin): it
        resumes on `resume`, not on its own. `by` says who asks (default: its owner or an admin)."""
        with self.ledger.step() as (tx, _view, now):
            lease = self.ledger.owned(tx, lease_id, requester, "suspend")
            by = by or (BY_ADMIN if requester is None or requester != lease.holder.name else BY_OWNER)
            return ask(tx, lease, by, reason or f"suspended by its {by}", False, now)

    def resume(self, lease_id: str, requester: Optional[str] = None) -> Lease:
        """A suspended lease takes room again as soon as there is some (holder or admin)."""
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, requester, "resume")
            lease = want_resume(tx, lease, now)
            view.tickets = None  # no ticket yet: place_waiting, at the end of this write, looks
        return self.watch.step(lease.id)  # placed at the end of that write if there was room

    def report_parked(self, lease_id: str, requester: Optional[str], host_bytes: int = 0, error: str = "") -> Lease:
        """The runner's word on a suspend: parked (`host_bytes` in host memory), or `error`."""
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, requester, "report on")
            view.invalidate()  # its slices go
            view.tickets = None  # a preemption's victim wants room back, with no ticket yet
            if error:
                return park_failed(tx, lease, error, now)
            return parked(tx, lease, view.devices, host_bytes, now)

    def report_restored(self, lease_id: str, requester: Optional[str], error: str = "") -> Lease:
        """The runner's word on a resume: restored, or `error` (the lease stays suspended)."""
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, requester, "report on")
            if error:
                view.invalidate()  # its slices go back
                return restore_failed(tx, lease, error, now)
            return restored(tx, lease, now)
