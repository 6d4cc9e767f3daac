"""Claims and grants: a claim granted now, queued, or polled until granted; a lease's heartbeat and release.

Fairness: while tickets exist only the head may be granted (pool/tickets.py). Queues
(pool/admission.py, core/queues.py): once any queue is defined, every claim takes a ticket and
admission picks the head by quota and weight, and may preempt borrowers. The view holds the queue
definitions, so a pool without queues pays nothing for them per claim: its claims never leave
the FIFO path. Every lease that ends is written to the lease history in the same transaction.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ...core.errors import (
    NO_ROOM_ADVICE,
    ClaimCancelled,
    Forbidden,
    GpupoolError,
    InvalidClaim,
    NotFound,
    Unavailable,
    Unsatisfiable,
)
from ...core.fragmentation import LearnedMix, ShapeHistogram, request_shape
from ...core.model import (
    MAX_TTL_S,
    MAX_WAIT_S,
    MIN_TTL_S,
    TIMEOUT_REASON,
    Claim,
    Device,
    Holder,
    Lease,
    Slice,
    check_exit_code,
    reap_at,
)
from ...core.placement import could_ever_fit, place
from ...core.suspension import BY_ADMIN
from ...logs import INFO, get_logger
from ..store.tx import Tx
from .ledger import Ledger, View, check_seconds, ended, gone
from .tickets import CANCELLED_KEY, POLL_MIN_S, TICKET_TTL_S, Waiter, note_reason, take_ticket, waiter_pauses

if TYPE_CHECKING:
    from typing import Iterable, Optional, Sequence, Tuple, Union

    from .admission import Decision

log = get_logger(__name__)

DEFAULT_TTL_S = 30.0
HISTOGRAM_KEY = "shape_histogram"  # meta row: fragaware's decaying histogram of claim shapes (JSON)
HISTOGRAM_SAVE_EVERY = 64


class Claims:
    """Grants claims as leases (now, or by polling a ticket), renews and releases them.

    Args:
        ledger: the pool's shared transaction state.
        preempt_grace_s: the grace of a preempted lease whose claim gives none.
        preempt_mode: what preempting a borrower does where its queue does not say.
    """

    def __init__(self, ledger: Ledger, preempt_grace_s: float, preempt_mode: str) -> None:
        self.ledger = ledger
        self.preempt_grace_s = preempt_grace_s
        self.preempt_mode = preempt_mode
        # fragaware's mix: the claims seen, kept in the store's meta table across processes and restarts
        self.mix = LearnedMix(histogram=self.load_histogram())
        self._claims_seen = 0

    def claim(
        self, claim: Claim, holder: Holder, wait_s: float = 0.0, ttl_s: float = DEFAULT_TTL_S, key: str = ""
    ) -> Lease:
        """Grant `claim` to `holder` now, or wait in the FIFO queue up to `wait_s` seconds.

        Raises Unsatisfiable when no state of the pool could hold it, and
        Unavailable (with the placement reason) when the wait runs out.
        """
        wait_s = check_seconds(wait_s, "wait_s", 0.0, MAX_WAIT_S)
        begun = time.monotonic()  # the wait counts from here, before the first transaction
        started = self.begin(claim, holder, wait_s=wait_s, ttl_s=ttl_s, key=key)
        if isinstance(started, Lease):
            return started
        waiter = started
        waiter.begun = begun
        granted = False
        try:
            for pause in waiter_pauses(waiter):
                time.sleep(pause)
                lease = self.try_grant(waiter)
                if lease is not None:
                    granted = True
                    return lease
            raise self.timed_out(waiter, waiter.wait_s)
        finally:
            if not granted:
                self.cancel(waiter)

    def begin(
        self, claim: Claim, holder: Holder, wait_s: float = 0.0, ttl_s: float = DEFAULT_TTL_S, key: str = ""
    ) -> Union[Lease, Waiter]:
        """Grant now, or (when `wait_s` > 0) take a ticket and return the Waiter to poll.

        The building block of `claim`; the HTTP server polls with asyncio
        instead of holding a thread per waiting claim. `key` (the client's name for this claim,
        the same in each try of it) makes a retry find what an earlier try got: the lease granted
        while its answer was lost, or the ticket that keeps its place in the queue.
        """
        ttl_s = check_seconds(ttl_s, "ttl_s", MIN_TTL_S, MAX_TTL_S)
        wait_s = check_seconds(wait_s, "wait_s", 0.0, MAX_WAIT_S)
        if not isinstance(claim, Claim):
            raise InvalidClaim(f"claim must be a Claim, got {type(claim).__name__}")
        with self.ledger.step() as (tx, view, now):
            devices = view.devices
            self._observe(claim, devices)
            self._save_histogram(tx)
            reason = ""
            outcome: Union[Lease, Waiter, Exception, None] = None
            queued = view.tickets if view.tickets is not None else tx.ticket_count()
            if key:
                outcome = self._reattach(tx, view, claim, holder, wait_s, ttl_s, now, key)
            if outcome is not None:
                pass
            elif view.queues or claim.queue:
                outcome = self._begin_in_queue(tx, view, claim, holder, wait_s, ttl_s, now, key)
            elif queued == 0 or tx.unheld_ticket_count() == 0:  # held claims (gpupool claim hold) are passed over
                # Fits now: it could ever fit, and could_ever_fit need not be asked.
                placement = place(devices, view.allocated, claim, self.mix.frag)
                if placement.fits:
                    assert placement.slices is not None
                    outcome = self.grant(tx, view, placement.slices, claim, holder, ttl_s, now, key)
                else:
                    reason = placement.reason
            else:
                reason = f"{queued} earlier claim(s) are waiting in the queue"
            if outcome is None:
                ever = could_ever_fit(devices, claim)
                if not ever.fits:
                    outcome = Unsatisfiable(f"this pool can never grant {claim.describe()}: {ever.reason}")
                elif wait_s <= 0:
                    outcome = Unavailable(f"no room now for {claim.describe()}: {reason}; {NO_ROOM_ADVICE}")
                else:
                    ticket = take_ticket(tx, claim, holder, self.ledger.host, now, key)
                    view.tickets = None
                    outcome = Waiter(ticket, claim, holder, ttl_s, reason, wait_s, now, key=key)
                    log.info("claim %s queued as ticket %d: %s", claim.describe(), ticket, reason)
            if isinstance(outcome, Waiter):
                note_reason(tx, outcome)
        # Raised after COMMIT so the expiry done above is kept.
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _reattach(
        self, tx: Tx, view: View, claim: Claim, holder: Holder, wait_s: float, ttl_s: float, now: float, key: str
    ) -> Union[Lease, Waiter, None]:
        """A retried claim: the lease its key was granted, or its ticket, now polled by this process; None
        for a first try. Only the same holder (the token's name with auth on) finds them."""
        lease = tx.lease_by_key(key, holder.name)
        if lease is not None:
            log.info("claim %s retried: lease %s was granted to it", key, lease.id)
            return lease
        ticket = tx.ticket_by_key(key, holder.name)
        if ticket is None:
            return None
        tx.adopt_ticket(ticket, self.ledger.host, os.getpid(), now + TICKET_TTL_S)
        view.tickets = None
        log.info("claim %s retried: back in the queue as ticket %d", key, ticket)
        # Its place is kept, so one poll at least, even when the retry has no wait left.
        return Waiter(
            ticket, claim, holder, ttl_s, "back in its place in the queue", max(wait_s, POLL_MIN_S), now, key=key
        )

    def _begin_in_queue(
        self, tx: Tx, view: View, claim: Claim, holder: Holder, wait_s: float, ttl_s: float, now: float, key: str
    ) -> Union[Lease, Waiter, Exception]:
        """begin_claim in a pool with queues: take a ticket, and let admission decide at once."""
        # Lazily: core.queues and admission serve pools with queues; a plain claim never loads them.
        from .admission import check_claim_queue

        try:
            check_claim_queue(claim, view.queues, view.devices)
        except GpupoolError as err:
            return err
        spec = view.queues.get(claim.queue)
        queued = view.tickets if view.tickets is not None else tx.ticket_count()
        if queued == 0 and (spec is None or spec.limit is None):
            # Alone and with no limit to check, it goes next whatever the queues hold: grant it
            # if it fits, without reading every lease; admission below when it does not.
            placement = place(view.devices, view.allocated, claim, self.mix.frag)
            if placement.fits:
                assert placement.slices is not None
                return self.grant(tx, view, placement.slices, claim, holder, ttl_s, now, key)
        ever = could_ever_fit(view.devices, claim)
        if not ever.fits:
            return Unsatisfiable(f"this pool can never grant {claim.describe()}: {ever.reason}")
        ticket = take_ticket(tx, claim, holder, self.ledger.host, now, key)
        view.tickets = None
        decision = self.admit(tx, view, ticket, claim, now)
        if decision.slices is not None:
            tx.delete_ticket(ticket)
            return self.grant(tx, view, decision.slices, claim, holder, ttl_s, now, key)
        wait = max(wait_s, decision.wait_at_least_s)
        if wait <= 0:
            tx.delete_ticket(ticket)
            return Unavailable(f"no room now for {claim.describe()}: {decision.reason}; {NO_ROOM_ADVICE}")
        log.info("claim %s queued as ticket %d: %s", claim.describe(), ticket, decision.reason)
        return Waiter(ticket, claim, holder, ttl_s, decision.reason, wait, now, key=key)

    def admit(self, tx: Tx, view: View, ticket: int, claim: Claim, now: float) -> Decision:
        # Lazily: core.queues and admission serve pools with queues; a plain claim never loads them.
        from .admission import admit

        decision = admit(
            tx, ticket, claim, view.queues, view.devices, view.allocated, self.mix.frag, now, self.preempt_mode
        )
        for lease in decision.preempted:  # they now expire (are reaped) sooner
            view.next_expiry = min(view.next_expiry, lease.expires_at)
        return decision

    def room_for(self, tx: Tx, view: View, ticket: int, claim: Claim, now: float) -> Optional[Tuple[Slice, ...]]:
        """The slices `ticket` is granted now, as any waiting claim would be, or None."""
        if view.queues or claim.queue:
            return self.admit(tx, view, ticket, claim, now).slices
        if tx.head_ticket() != ticket:
            return None
        placement = place(view.devices, view.allocated, claim, self.mix.frag)
        return placement.slices if placement.fits else None

    def try_grant(self, waiter: Waiter) -> Optional[Lease]:
        """One poll of a waiting claim: grant it if it heads the queue and fits now."""
        with self.ledger.write() as (tx, view):
            lease = self._try_grant(tx, view, waiter)
            if lease is None and not waiter.cancelled:
                note_reason(tx, waiter)
        if waiter.cancelled:  # after COMMIT: the note is read once
            raise ClaimCancelled(
                f"claim {waiter.ticket} ({waiter.claim.describe()}) was cancelled by {waiter.cancelled} "
                "while it waited (`gpupool claim cancel`): the command did not run"
            )
        return lease

    def _try_grant(self, tx: Tx, view: View, waiter: Waiter) -> Optional[Lease]:
        now = self.ledger.clock()
        self.ledger.due(tx, view, now)
        view.tickets = None
        kept = tx.refresh_ticket(waiter.ticket, now + TICKET_TTL_S)
        if kept is None:
            by = tx.take_meta(f"{CANCELLED_KEY}{waiter.ticket}")
            if by is not None:
                waiter.cancelled = by
                return None
        if kept is None:
            # We were silent long enough to be taken for dead: queue again, at the back.
            waiter.ticket = take_ticket(tx, waiter.claim, waiter.holder, self.ledger.host, now, waiter.key)
            waiter.noted = ""  # the new ticket holds no reason yet
            log.warning("ticket of %s had expired; queued again as %d", waiter.holder.describe(), waiter.ticket)
        else:
            priority, held = kept
            if priority != waiter.claim.priority:  # changed while it waits (gpupool claim priority): the lease gets it
                waiter.claim = replace(waiter.claim, priority=priority)
            if held:
                waiter.reason = f"held: skipped by grants until `gpupool claim release {waiter.ticket}`"
                return None
        if view.queues or waiter.claim.queue:
            return self._grant_in_queue(tx, view, waiter, now)
        head = tx.head_ticket()
        if head != waiter.ticket:
            waiter.reason = f"{tx.tickets_before(waiter.ticket)} earlier claim(s) are waiting in the queue"
            return None
        placement = place(view.devices, view.allocated, waiter.claim, self.mix.frag)
        if not placement.fits:
            waiter.reason = placement.reason
            return None
        assert placement.slices is not None
        tx.delete_ticket(waiter.ticket)
        return self.grant(tx, view, placement.slices, waiter.claim, waiter.holder, waiter.ttl_s, now, waiter.key)

    def _grant_in_queue(self, tx: Tx, view: View, waiter: Waiter, now: float) -> Optional[Lease]:
        # Lazily: core.queues and admission serve pools with queues; a plain claim never loads them.
        from .admission import unknown_queue

        if waiter.claim.queue and waiter.claim.queue not in view.queues:
            waiter.reason = str(unknown_queue(waiter.claim.queue, view.queues))  # deleted while it waited
            return None
        decision = self.admit(tx, view, waiter.ticket, waiter.claim, now)
        if decision.slices is None:
            waiter.reason = decision.reason
            if decision.wait_at_least_s > 0:
                waiter.wait_s = max(waiter.wait_s, now - waiter.started + decision.wait_at_least_s)
            return None
        tx.delete_ticket(waiter.ticket)
        return self.grant(tx, view, decision.slices, waiter.claim, waiter.holder, waiter.ttl_s, now, waiter.key)

    def cancel(self, waiter: Waiter) -> None:
        """Leave the queue (timeout, client gone)."""
        with self.ledger.write() as (tx, view):
            tx.delete_ticket(waiter.ticket)
            view.tickets = None

    def timed_out(self, waiter: Waiter, wait_s: float) -> Unavailable:
        return Unavailable(
            f"no room for {waiter.claim.describe()} after waiting {wait_s:g} s: {waiter.reason}; "
            "wait longer or ask for less"
        )

    def grant(
        self,
        tx: Tx,
        view: View,
        slices: Iterable[Slice],
        claim: Claim,
        holder: Holder,
        ttl_s: float,
        now: float,
        key: str = "",
    ) -> Lease:
        lease = Lease(
            id=os.urandom(8).hex(),  # secrets.token_hex(8), without importing secrets
            holder=holder,
            slices=tuple(slices),
            ttl_s=ttl_s,
            created_at=now,
            expires_at=now + ttl_s,
            queue=claim.queue,
            priority=claim.priority,
            preempt_grace_s=self.preempt_grace_s if claim.preempt_grace_s is None else claim.preempt_grace_s,
            idle_suspend_s=claim.idle_suspend_s,
        )
        tx.insert_lease(lease, key)
        allocated = view.allocated
        for sl in lease.slices:
            allocated[sl.device_uuid] = allocated.get(sl.device_uuid, 0) + sl.memory_mib
        if lease.expires_at < view.next_expiry:
            view.next_expiry = lease.expires_at
        if log.isEnabledFor(INFO):
            log.info("lease %s granted to %s", lease.id, holder.describe())
        return lease

    def heartbeat(self, lease_id: str, requester: Optional[str] = None) -> Lease:
        """Extend the lease by its TTL from now; `requester` None acts as admin."""
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, requester, "renew")
            # A preempted lease lives on until it is reaped, not longer.
            lease = replace(lease, expires_at=min(now + lease.ttl_s, reap_at(lease) or math.inf))
            tx.set_lease_expiry(lease.id, lease.expires_at)
            if lease.expires_at < view.next_expiry:  # only if the clock went back
                view.next_expiry = lease.expires_at
        return lease

    def release(
        self,
        lease_id: str,
        requester: Optional[str] = None,
        exit_code: Optional[int] = None,
        caller: Optional[str] = None,
        timed_out: bool = False,
    ) -> None:
        """Give the lease's memory back; `requester` None acts as admin. `exit_code` is its command's,
        as its runner says (a label kept in the history: 0-255, None when not said). The history
        keeps who released it: its owner when the requester, or an admin's `caller` name (an admin
        token's, the embedded pool's local user), is its holder's name; an admin otherwise. Its
        runner's watch is told so (`_ended`). `timed_out`: its runner ended the command at its
        time limit (`gpupool run --time`): the history says `timeout` instead of `released`."""
        lease_id = str(lease_id)
        exit_code = check_exit_code(exit_code)
        asking = requester if requester is not None else caller
        with self.ledger.step() as (tx, view, now):
            # Rolled back with the rest when it fails below.
            tx.record_end(lease_id, now, TIMEOUT_REASON if timed_out else "released", exit_code, BY_ADMIN, asking)
            taken = tx.take_lease(lease_id)
            if taken is None:
                raise NotFound(ended(tx, lease_id))
            holder_name, slices = taken
            if requester is not None and requester != holder_name:
                # Raising rolls the delete back.
                raise Forbidden(
                    f"lease {lease_id} is held by {holder_name!r}, not {requester!r}: "
                    "only its holder or an admin token may release it"
                )
            allocated = view.allocated
            for uuid, mib in slices:
                allocated[uuid] = allocated.get(uuid, 0) - mib
        if log.isEnabledFor(INFO):
            log.info("lease %s released", lease_id)

    def lease(self, lease_id: str) -> Lease:
        """One live lease; NotFound when released or expired."""
        with self.ledger.store.read() as tx:
            lease = tx.get_lease(str(lease_id))
            if lease is None:
                raise NotFound(ended(tx, lease_id))
        if lease.expires_at < self.ledger.clock():
            raise NotFound(gone(lease_id))
        return lease

    def load_histogram(self) -> Optional[ShapeHistogram]:
        with self.ledger.store.read() as tx:
            text = tx.meta(HISTOGRAM_KEY)
        if not text:
            return None
        try:
            return ShapeHistogram.from_dict(json.loads(text))
        except (ValueError, TypeError, KeyError, GpupoolError) as err:  # a damaged row: learn again
            log.warning("ignoring the stored claim-shape histogram (%s): learning it again", err)
            return None

    def _save_histogram(self, tx: Tx) -> None:
        """Write the histogram with this process's first claim (short-lived `gpupool run`s add theirs),
        then every HISTOGRAM_SAVE_EVERY claims (a server's); concurrent writers may lose a few counts."""
        self._claims_seen += 1
        if self._claims_seen == 1 or self._claims_seen % HISTOGRAM_SAVE_EVERY == 0:
            tx.set_meta(HISTOGRAM_KEY, json.dumps(self.mix.histogram.to_dict()))

    def _observe(self, claim: Claim, devices: Sequence[Device]) -> None:
        """Count the claim's shapes in fragaware's mix (a request no GPU here matches is not counted)."""
        for request in claim.requests:
            device = next((d for d in devices if d.healthy and request.accepts(d)), None)
            if device is not None:
                self.mix.observe(request_shape(request, device))
