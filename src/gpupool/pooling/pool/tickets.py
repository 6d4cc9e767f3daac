"""Tickets: the waiting claims. A claim that cannot be granted at once and may wait takes a ticket.

While tickets exist only the next one (the head: highest priority, then the oldest) may be
granted, so a stream of small claims cannot starve a big one waiting for whole GPUs. Here: the
`Waiter` a waiting claim polls with, the one backoff of its polls, taking a ticket, and the verbs
on waiting claims (list, hold, priority, cancel); granting one is `Claims.try_grant`'s.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...core.errors import Forbidden, InvalidClaim, InvalidInput, NotFound
from ...core.model import Claim, Holder, check_priority
from ...logs import get_logger
from ..store.tx import Tx

if TYPE_CHECKING:
    from typing import Callable, Iterator, List, Optional, Sequence, Tuple

    from ...core.fragmentation import LearnedMix
    from ...core.model import Device
    from ...core.queues import QueuedClaim
    from ...core.status import WaitingClaim
    from .ledger import Ledger

log = get_logger(__name__)

# A waiter refreshes its ticket on every poll; one silent for this long is
# taken for dead (its process was killed) and leaves the queue.
TICKET_TTL_S = 5.0
# A waiting claim polls its ticket 5 ms after queueing, then half as late again each time, up to 100 ms.
POLL_MIN_S = 0.005
POLL_MAX_S = 0.1
# meta key prefix: the note a cancelled claim's waiter reads once (who cancelled ticket N)
CANCELLED_KEY = "cancelled."
# A waiting claim's reason is kept to this length for status.
MAX_REASON_CHARS = 500


@dataclass
class Waiter:
    """A claim waiting in the queue under ticket `ticket`."""

    ticket: int
    claim: Claim
    holder: Holder
    ttl_s: float
    reason: str = ""
    # The wait it gets: the wait asked, or longer while it waits for leases it preempted.
    wait_s: float = 0.0
    started: float = 0.0  # pool clock when it was queued
    begun: float = field(default_factory=time.monotonic)  # when its wait began (waiter_pauses counts from it)
    key: str = ""  # the client's key of the claim: a retry (after a restart) finds its ticket or lease
    noted: str = ""  # the reason last written to its ticket, for status
    cancelled: str = ""  # who cancelled it (`gpupool claim cancel`): its poll raises ClaimCancelled


def waiter_pauses(waiter: Waiter, clock: Callable[[], float] = time.monotonic) -> Iterator[float]:
    """The pauses of a waiting claim between polls (the schedule of `poll_delays`), ending when
    `waiter.wait_s` has passed since `waiter.begun`. It reads `wait_s` at every pause, because
    the wait grows while the claim waits for the leases it preempted."""
    delay = POLL_MIN_S
    while True:
        remaining = waiter.begun + waiter.wait_s - clock()
        if remaining <= 0:
            return
        yield min(delay, remaining)
        delay = min(delay * 1.5, POLL_MAX_S)


def poll_delays(wait_s: float, clock: Callable[[], float] = time.monotonic) -> Iterator[float]:
    """The pauses of a waiting claim between polls of its ticket, ending when `wait_s` has passed.

    The one backoff schedule: `Pool.claim` sleeps them, the server's event loop awaits them.
    The wait counts from this call, not from the first pause.
    """
    deadline = clock() + wait_s
    return _pauses(deadline, clock)


def _pauses(deadline: float, clock: Callable[[], float]) -> Iterator[float]:
    delay = POLL_MIN_S
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            return
        yield min(delay, remaining)
        delay = min(delay * 1.5, POLL_MAX_S)


def take_ticket(tx: Tx, claim: Claim, holder: Holder, host: str, now: float, key: str = "", pid: int = -1) -> int:
    """A place in the queue for `claim`, held while this process polls it (see TICKET_TTL_S); `pid`
    0: held while the writes that place it refresh it, whichever process makes them (a resume's)."""
    ticket = tx.add_ticket(
        claim.to_dict(),
        holder.to_dict(),
        host,
        os.getpid() if pid < 0 else pid,
        now,
        now + TICKET_TTL_S,
        queue=claim.queue,
        priority=claim.priority,
        key=key,
    )
    tx.take_meta(f"{CANCELLED_KEY}{ticket}")  # a cancelled ticket's id taken again: its note is not this one's
    return ticket


def note_reason(tx: Tx, waiter: Waiter) -> None:
    """Write why `waiter` waits to its ticket when that changed (status shows it)."""
    if waiter.reason != waiter.noted:
        tx.set_ticket_reason(waiter.ticket, waiter.reason[:MAX_REASON_CHARS])
        waiter.noted = waiter.reason


class Tickets:
    """The verbs on waiting claims: list them, hold, reprioritize or cancel one."""

    def __init__(self, ledger: Ledger, mix: LearnedMix) -> None:
        self.ledger = ledger
        self.mix = mix

    def queue(self) -> List[QueuedClaim]:
        """The claims waiting in the FIFO queue, oldest first (live tickets only), for views and metrics."""
        from ...core.queues import QueuedClaim  # lazily: a run never lists the queue

        now = self.ledger.clock()
        with self.ledger.store.read() as tx:
            rows = sorted(tx.waiting_rows(now))  # live tickets only: a dead waiter's goes at the next write
        waiting: List[QueuedClaim] = []
        for ticket, claim, holder, created_at, *_ in rows:
            try:
                waiting.append(
                    QueuedClaim(
                        ticket, Claim.from_dict(json.loads(claim)), Holder.from_dict(json.loads(holder)), created_at
                    )
                )
            except (ValueError, KeyError, TypeError, InvalidClaim):
                log.warning("ticket %d holds a claim this version cannot read; left out of the queue view", ticket)
        return waiting

    def waiting(self, queue: Optional[str] = None, key: str = "") -> List[WaitingClaim]:
        """The live waiting claims in the order the pool grants them, each with why it waits
        (admission.waiting_order); held ones last. `queue` keeps that queue's, `key` the one claim
        with that client key (a waiting `gpupool run` finds its place)."""
        now = self.ledger.clock()
        with self.ledger.store.read() as tx:
            if queue and queue not in {spec.name for spec in tx.queue_specs()}:
                known = ", ".join(sorted(spec.name for spec in tx.queue_specs())) or "none"
                raise NotFound(f"queue {queue!r} does not exist (queues: {known}): `gpupool queue list` shows them")
            shown = self.in_order(tx, self.ledger.devices(tx), now, key)
        return [w for w in shown if queue is None or w.queue == queue]

    def in_order(self, tx: Tx, devices: Sequence[Device], now: float, key: str = "") -> List[WaitingClaim]:
        """The live waiting claims in the order the pool grants them (admission.waiting_order); `key`
        keeps the one with that client key."""
        from .admission import waiting_order  # lazily: a run never lists the queue

        rows = tx.queue_rows(now)
        specs = {spec.name: spec for spec in tx.queue_specs()}
        shown = waiting_order(tx, rows, specs, devices, tx.allocated(), self.mix.frag)
        if key:
            mine = {row[0] for row in rows if row[8] == key}
            shown = [w for w in shown if w.ticket in mine]
        return shown

    def hold(self, claim_id: object, requester: Optional[str] = None, held: bool = True) -> WaitingClaim:
        """Keep waiting claim `claim_id` (its ticket) in the queue but skip it in grants (`held`), or
        grant it again in the place its age and priority give it (not `held`); its holder or an
        admin (`requester` None)."""
        verb = "hold" if held else "release"
        return self._change(claim_id, requester, verb, lambda tx, ticket: tx.set_ticket_held(ticket, held))

    def set_priority(self, claim_id: object, priority: object, requester: Optional[str] = None) -> WaitingClaim:
        """Change the priority of waiting claim `claim_id`: its order within its queue (and its lease's)."""
        value = check_priority(priority, InvalidInput)
        return self._change(
            claim_id, requester, "change the priority of", lambda tx, ticket: tx.set_ticket_priority(ticket, value)
        )

    def cancel(self, claim_id: object, requester: Optional[str] = None) -> WaitingClaim:
        """Take waiting claim `claim_id` out of the queue (its holder or an admin; `requester` None
        acts as admin): its waiter's next poll raises ClaimCancelled naming who. Returns the claim
        as `waiting` listed it."""
        with self.ledger.step() as (tx, view, now):
            ticket, holder = _waiting_ticket(tx, claim_id, requester, "cancel")
            found = [w for w in self.in_order(tx, view.devices, now) if w.ticket == ticket]
            if not found:
                raise NotFound(_no_claim(claim_id))
            tx.delete_ticket(ticket)
            tx.set_meta(f"{CANCELLED_KEY}{ticket}", "an admin" if requester is None else f"its holder {requester!r}")
            view.tickets = None
        log.info("claim %d of %s cancelled by %s", ticket, holder, requester or "an admin")
        return found[0]

    def _change(
        self, claim_id: object, requester: Optional[str], verb: str, change: Callable[[Tx, int], None]
    ) -> WaitingClaim:
        """`change` the ticket of waiting claim `claim_id` in one transaction, its holder or an admin;
        NotFound (naming the id) when no such claim waits. Returns it as `waiting` lists it."""
        with self.ledger.step() as (tx, view, _now):
            ticket, _holder = _waiting_ticket(tx, claim_id, requester, verb)
            change(tx, ticket)
            view.tickets = None
        log.info("claim %d: %s", ticket, verb)
        found = [w for w in self.waiting() if w.ticket == ticket]
        if not found:
            raise NotFound(_no_claim(claim_id))
        return found[0]


def _waiting_ticket(tx: Tx, claim_id: object, requester: Optional[str], verb: str) -> Tuple[int, str]:
    """The ticket of waiting claim `claim_id` and its holder, where `requester` (None: an admin) may
    `verb` it: NotFound naming the id, Forbidden naming both holders."""
    ticket = _ticket_id(claim_id)
    holder = tx.ticket_holder(ticket)
    if holder is None:
        raise NotFound(_no_claim(claim_id))
    if requester is not None and requester != holder:
        raise Forbidden(
            f"claim {ticket} is waiting for {holder!r}, not {requester!r}: "
            f"only its holder or an admin token may {verb} it"
        )
    return ticket, holder


def _ticket_id(claim_id: object) -> int:
    """A claim id (a ticket: a whole number) from an int or its text; NotFound naming it otherwise."""
    if isinstance(claim_id, int) and not isinstance(claim_id, bool):
        return claim_id
    text = str(claim_id).strip()
    if text.isdigit() and len(text) < 19:
        return int(text)
    raise NotFound(_no_claim(claim_id))


def _no_claim(claim_id: object) -> str:
    return (
        f"claim {claim_id!r} is not waiting: it was granted, it gave up, or there is no such claim; "
        "`gpupool queue show` lists the waiting claims and their ids"
    )
