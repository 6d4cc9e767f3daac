"""`Pool`: grants claims as leases, keeps the FIFO queue, reclaims expired leases.

Every state change is one SQLite transaction (BEGIN IMMEDIATE), and every one
first reclaims expired leases and dead waiters, so several processes on one
state dir (the embedded `gpupool run`s of a workstation, or a server and its
admin CLI) need nothing but the database to agree.

Speed: each thread keeps a `View` of what its connection last saw (devices,
MiB allocated per device, queue length, a lower bound of the next expiry).
It is checked at the start of every transaction against PRAGMA data_version
(which moves when any other connection commits) and the store's count of
this connection's commits, and rebuilt from the database when either moved,
so a claim is BEGIN IMMEDIATE + two INSERTs + COMMIT, never a stale answer.

Fairness: a claim that cannot be granted at once and may wait takes a ticket.
While tickets exist only the next one (the head: highest priority, then the
oldest) may be granted, so a stream of small claims cannot starve a big one
waiting for whole GPUs.

Queues (pool/admission.py, core/queues.py): once any queue is defined, every
claim takes a ticket and admission picks the head by quota and weight, and may
preempt borrowers. The view holds the queue definitions, so a pool without
queues pays nothing for them per claim: its claims never leave the path above.
Every lease that ends is written to the lease history in the same transaction
(pool/accounting.py).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import (
    NO_ROOM_ADVICE,
    ClaimCancelled,
    Forbidden,
    GpupoolError,
    InvalidClaim,
    InvalidInput,
    NotFound,
    Unavailable,
    Unsatisfiable,
)
from ..core.fragmentation import LearnedMix, ShapeHistogram, request_shape
from ..core.isolation_mode import NodeIsolation
from ..core.model import (
    DEFAULT_PREEMPT_GRACE_S,
    MAX_PREEMPT_GRACE_S,
    SUSPENDED,
    TIMEOUT_REASON,
    Claim,
    Device,
    Holder,
    Lease,
    Slice,
    check_exit_code,
    check_priority,
    reap_at,
)
from ..core.model import MAX_TTL_S as MAX_TTL_S  # the limits live in core; importers of the pool keep them
from ..core.model import MAX_WAIT_S as MAX_WAIT_S
from ..core.model import MIN_TTL_S as MIN_TTL_S
from ..core.outage import TICKET_REATTACH_S
from ..core.placement import could_ever_fit, place
from ..core.status import PoolStatus, WaitingClaim
from ..core.suspension import BY_ADMIN, BY_OWNER, DEFAULT_PREEMPT_MODE, check_preempt_mode
from ..devices.health import is_emulated
from ..isolation.emulated_usage import DEFAULT_USAGE_FILE
from ..logs import INFO, get_logger
from ..store import Store
from ..store.tx import Tx
from . import accounting, suspend
from .ledger import Ledger, View, check_seconds, check_time, ended, gone

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

    from ..core.queues import LeaseRecord, QueuedClaim, QueueSpec, QueueStatus, UsageRow
    from ..core.usage import UsageReport
    from .admission import Decision

log = get_logger(__name__)

HISTOGRAM_KEY = "shape_histogram"  # meta row: fragaware's decaying histogram of claim shapes (JSON)
HISTOGRAM_SAVE_EVERY = 64

DEFAULT_TTL_S = 30.0
# A waiter refreshes its ticket on every poll; one silent for this long is
# taken for dead (its process was killed) and leaves the queue.
TICKET_TTL_S = 5.0
# The lease history (usage accounting) keeps what ended in the last 90 days; the expiry sweep
# of a long-lived pool (the server's, the agent's) deletes older rows once an hour.
HISTORY_RETENTION_S = 90 * 86400.0
HISTORY_PRUNE_EVERY_S = 3600.0
# A waiting claim polls its ticket 5 ms after queueing, then half as late again each time, up to 100 ms.
POLL_MIN_S = 0.005
POLL_MAX_S = 0.1
# meta keys of the node-wide records every view reads
ISOLATION_KEY = "isolation"
USAGE_KEY = "usage"
# meta key prefix: the note a cancelled claim's waiter reads once (who cancelled ticket N)
CANCELLED_KEY = "cancelled."
# A waiting claim's reason is kept to this length for status.
MAX_REASON_CHARS = 500
# Pool.watch reads the lease this often.
WATCH_POLL_S = 0.1
MAX_WATCH_S = 3600.0


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


class Pool:
    """The pool of one state dir, safe from several threads and several processes.

    Args:
        state_dir: where pool.db lives (created if missing).
        devices: the devices to serve; None keeps those already stored, and
            discovers them (env GPUPOOL_DEVICES, else NVML) when none are.
        node: the node name reported by status (default: the host name).
        clock: wall clock in seconds, injectable for tests.
        preempt_grace_s: the grace of a preempted lease whose claim gives none.
        preempt_mode: what preempting a borrower does where its queue does not say (suspend,
            requeue, kill: core/suspension.py).
        devices_from_env: `devices` came from $GPUPOOL_DEVICES, not a flag: they may not replace
            other devices the state dir already serves (InvalidInput says how to choose).
        serving: this pool is a server's (or node agent's), which holds the state dir's lock: its
            open renews what was live when the last server stopped, its sweeps stamp it (pool/resume.py).
    """

    def __init__(
        self,
        state_dir: Union[str, Path],
        devices: Optional[Sequence[Device]] = None,
        node: str = "",
        clock: Callable[[], float] = time.time,
        synchronous: Optional[str] = None,
        background_checkpoint: bool = False,
        preempt_grace_s: float = DEFAULT_PREEMPT_GRACE_S,
        serving: bool = False,
        preempt_mode: str = DEFAULT_PREEMPT_MODE,
        devices_from_env: bool = False,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.serving = serving
        # what a preempted lease's runner waits between SIGTERM and SIGKILL, unless its claim says
        self.preempt_grace_s = check_seconds(preempt_grace_s, "preempt_grace_s", 0.0, MAX_PREEMPT_GRACE_S)
        # what preempting a borrower does, in a queue that does not say
        self.preempt_mode = check_preempt_mode(preempt_mode)
        self._next_history_prune = 0.0  # the first sweep prunes
        # background_checkpoint: for long-lived processes (the server), see store.db.
        self.store = Store(self.state_dir, synchronous=synchronous, background_checkpoint=background_checkpoint)
        self.clock = clock
        # os.uname().nodename is gethostname(2), without importing socket (gpupool run starts faster).
        self.node = node or os.uname().nodename
        # the transaction state every verb shares (pool/ledger.py)
        self.ledger = Ledger(self.store, clock, os.uname().nodename)
        self._closed = threading.Event()  # set by close(): ends the watches of other threads
        # fragaware's mix: the claims seen, kept in the store's meta table across processes and restarts
        self.mix = LearnedMix()
        self._claims_seen = 0
        try:
            self.mix = LearnedMix(histogram=self._load_histogram())
            if devices is None:
                with self.store.read() as tx:
                    known = tx.devices()
                if not known:
                    from ..devices import discover  # lazy: NVML probing is slow and rarely needed

                    devices = discover(None, self.node)
            if devices is not None:
                with self.store.write() as tx:
                    if devices_from_env:
                        _check_env_devices(self.state_dir, tx.devices(), devices)
                    changed = tx.replace_devices(list(devices))
                # Devices may have shrunk or gone since leases were granted: the open that changes
                # them says so (status and /metrics say it every time). Placement counts those
                # leases anyway, so no new claim gets memory they hold.
                if changed:
                    for problem in self.status().problems():
                        log.warning("%s", problem)
            if serving:
                self._resume()
        except BaseException:
            self.store.close()  # no pool to close it later: NVML missing must not leak connections
            raise

    @classmethod
    def open(cls, state_dir: Union[str, Path], **kwargs: Any) -> Pool:
        return cls(state_dir, **kwargs)

    def _resume(self) -> None:
        """A server's start: renew what was live when the last server stopped (pool/resume.py)."""
        from .resume import resume  # lazily: only a server resumes; a run's embedded pool never loads it

        with self.store.write() as tx:
            resumed = resume(tx, self.clock())
        if resumed.leases or resumed.tickets:
            log.warning(
                "resumed after %.1f s without a server: %d lease(s) renewed for a full TTL, %d waiting claim(s) "
                "keep their place for %g s, %d preemption(s) with no claim left waiting undone",
                resumed.down_s,
                resumed.leases,
                resumed.tickets,
                TICKET_REATTACH_S,
                resumed.undone,
            )

    def close(self) -> None:
        self._closed.set()
        self.store.close()

    # --- claims ----------------------------------------------------------------
    def claim(
        self, claim: Claim, holder: Holder, wait_s: float = 0.0, ttl_s: float = DEFAULT_TTL_S, key: str = ""
    ) -> Lease:
        """Grant `claim` to `holder` now, or wait in the FIFO queue up to `wait_s` seconds.

        Raises Unsatisfiable when no state of the pool could hold it, and
        Unavailable (with the placement reason) when the wait runs out.
        """
        wait_s = check_seconds(wait_s, "wait_s", 0.0, MAX_WAIT_S)
        begun = time.monotonic()  # the wait counts from here, before the first transaction
        started = self.begin_claim(claim, holder, wait_s=wait_s, ttl_s=ttl_s, key=key)
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

    def begin_claim(
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
                    outcome = self._grant(tx, view, placement.slices, claim, holder, ttl_s, now, key)
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
                    ticket = self._take_ticket(tx, claim, holder, now, key)
                    view.tickets = None
                    outcome = Waiter(ticket, claim, holder, ttl_s, reason, wait_s, now, key=key)
                    log.info("claim %s queued as ticket %d: %s", claim.describe(), ticket, reason)
            if isinstance(outcome, Waiter):
                _note_reason(tx, outcome)
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

    def _take_ticket(self, tx: Tx, claim: Claim, holder: Holder, now: float, key: str = "") -> int:
        """A place in the queue for `claim`, held while this process polls it (see TICKET_TTL_S)."""
        ticket = tx.add_ticket(
            claim.to_dict(),
            holder.to_dict(),
            self.ledger.host,
            os.getpid(),
            now,
            now + TICKET_TTL_S,
            queue=claim.queue,
            priority=claim.priority,
            key=key,
        )
        tx.take_meta(f"{CANCELLED_KEY}{ticket}")  # a cancelled ticket's id taken again: its note is not this one's
        return ticket

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
                return self._grant(tx, view, placement.slices, claim, holder, ttl_s, now, key)
        ever = could_ever_fit(view.devices, claim)
        if not ever.fits:
            return Unsatisfiable(f"this pool can never grant {claim.describe()}: {ever.reason}")
        ticket = self._take_ticket(tx, claim, holder, now, key)
        view.tickets = None
        decision = self._admit(tx, view, ticket, claim, now)
        if decision.slices is not None:
            tx.delete_ticket(ticket)
            return self._grant(tx, view, decision.slices, claim, holder, ttl_s, now, key)
        wait = max(wait_s, decision.wait_at_least_s)
        if wait <= 0:
            tx.delete_ticket(ticket)
            return Unavailable(f"no room now for {claim.describe()}: {decision.reason}; {NO_ROOM_ADVICE}")
        log.info("claim %s queued as ticket %d: %s", claim.describe(), ticket, decision.reason)
        return Waiter(ticket, claim, holder, ttl_s, decision.reason, wait, now, key=key)

    def _admit(self, tx: Tx, view: View, ticket: int, claim: Claim, now: float) -> Decision:
        # Lazily: core.queues and admission serve pools with queues; a plain claim never loads them.
        from .admission import admit

        decision = admit(
            tx, ticket, claim, view.queues, view.devices, view.allocated, self.mix.frag, now, self.preempt_mode
        )
        for lease in decision.preempted:  # they now expire (are reaped) sooner
            view.next_expiry = min(view.next_expiry, lease.expires_at)
        return decision

    def _load_histogram(self) -> Optional[ShapeHistogram]:
        with self.store.read() as tx:
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

    def try_grant(self, waiter: Waiter) -> Optional[Lease]:
        """One poll of a waiting claim: grant it if it heads the queue and fits now."""
        with self.ledger.write() as (tx, view):
            lease = self._try_grant(tx, view, waiter)
            if lease is None and not waiter.cancelled:
                _note_reason(tx, waiter)
        if waiter.cancelled:  # after COMMIT: the note is read once
            raise ClaimCancelled(
                f"claim {waiter.ticket} ({waiter.claim.describe()}) was cancelled by {waiter.cancelled} "
                "while it waited (`gpupool claim cancel`): the command did not run"
            )
        return lease

    def _try_grant(self, tx: Tx, view: View, waiter: Waiter) -> Optional[Lease]:
        now = self.clock()
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
            waiter.ticket = self._take_ticket(tx, waiter.claim, waiter.holder, now, waiter.key)
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
        return self._grant(tx, view, placement.slices, waiter.claim, waiter.holder, waiter.ttl_s, now, waiter.key)

    def _grant_in_queue(self, tx: Tx, view: View, waiter: Waiter, now: float) -> Optional[Lease]:
        # Lazily: core.queues and admission serve pools with queues; a plain claim never loads them.
        from .admission import unknown_queue

        if waiter.claim.queue and waiter.claim.queue not in view.queues:
            waiter.reason = str(unknown_queue(waiter.claim.queue, view.queues))  # deleted while it waited
            return None
        decision = self._admit(tx, view, waiter.ticket, waiter.claim, now)
        if decision.slices is None:
            waiter.reason = decision.reason
            if decision.wait_at_least_s > 0:
                waiter.wait_s = max(waiter.wait_s, now - waiter.started + decision.wait_at_least_s)
            return None
        tx.delete_ticket(waiter.ticket)
        return self._grant(tx, view, decision.slices, waiter.claim, waiter.holder, waiter.ttl_s, now, waiter.key)

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

    def _grant(
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

    # --- leases ----------------------------------------------------------------
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
        with self.store.read() as tx:
            lease = tx.get_lease(str(lease_id))
            if lease is None:
                raise NotFound(ended(tx, lease_id))
        if lease.expires_at < self.clock():
            raise NotFound(gone(lease_id))
        return lease

    def expire(self) -> List[Lease]:
        """Reclaim leases past their expiry and drop dead waiters; returns the reclaimed leases."""
        # Not through the view: the sweep runs in threads that serve no claims, where
        # rebuilding a view (a SUM over every slice) under the write lock would be wasted.
        with self.store.write() as tx:
            now = self.clock()
            if self.serving:  # what the next start renews (pool/resume.py)
                from .resume import stamp_alive  # lazily, as in _resume

                stamp_alive(tx, now)
            if now >= self._next_history_prune:
                tx.prune_history(now - HISTORY_RETENTION_S)
                self._next_history_prune = now + HISTORY_PRUNE_EVERY_S
            return self.ledger.expire(tx, now)

    def status(self) -> PoolStatus:
        """Devices, live leases and queue length, from one read snapshot (never blocks writers)."""
        now = self.clock()
        with self.store.read() as tx:
            devices = self.ledger.devices(tx)
            leases = tx.leases("expires_at >= ?", (now,))
            waiting = tx.waiting_rows(now)
            isolation = tx.meta(ISOLATION_KEY)
            usage = tx.meta(USAGE_KEY)
            queues = accounting.statuses(tx, devices, now, self.preempt_mode)
            listed = self._waiting_in_order(tx, devices, now) if waiting else []
        # Each in the place the pool grants it (as `gpupool queue show`), with the reason it was last given.
        told = {row[0]: row[6] for row in waiting}
        return PoolStatus(
            tuple(devices),
            tuple(leases),
            len(waiting),
            self.node,
            NodeIsolation.from_dict(json.loads(isolation)) if isolation else NodeIsolation(),
            _usage_report(usage),
            tuple(queues),
            tuple(w._replace(reason=told.get(w.ticket) or w.reason) for w in listed),
            self.emulated_usage_file(devices),
        )

    def emulated_usage_file(self, devices: Optional[Sequence[Device]] = None) -> str:
        """The usage file this pool keeps for its emulated GPUs ("" when it has none of them)."""
        chosen = self.devices() if devices is None else devices
        return str(self.state_dir / DEFAULT_USAGE_FILE) if any(is_emulated(d.uuid) for d in chosen) else ""

    # --- queues and accounting ---------------------------------------------------
    def queues(self) -> List[QueueStatus]:
        """Every queue with what it holds, borrows and waits for."""
        now = self.clock()
        with self.store.read() as tx:
            return accounting.statuses(tx, self.ledger.devices(tx), now, self.preempt_mode)

    def queue_specs(self) -> List[QueueSpec]:
        """The queues' definitions alone (no load read): what the watchdog's idle reclaim needs."""
        with self.store.read() as tx:
            return tx.queue_specs()

    def set_queue(self, spec: QueueSpec) -> QueueStatus:
        """Create or update a queue; InvalidInput when the quotas would sum above the pool's GPUs."""
        from ..core.queues import QueueSpec, check_quotas_fit  # lazily: a pool without queues never loads core.queues

        if not isinstance(spec, QueueSpec):
            raise InvalidInput(f"a queue must be a QueueSpec, got {type(spec).__name__}")
        with self.ledger.write() as (tx, view):
            view.invalidate()  # its queue definitions changed
            others = [s for s in tx.queue_specs() if s.name != spec.name]
            check_quotas_fit(others + [spec], float(len(self.ledger.devices(tx))))
            tx.put_queue(spec)
        log.info("queue %s set: quota %g, weight %g, limit %s", spec.name, spec.quota, spec.weight, spec.limit)
        return next(q for q in self.queues() if q.spec.name == spec.name)

    def delete_queue(self, name: str) -> None:
        """Delete a queue; NotFound when there is none, InvalidInput while it has leases or waiting claims."""
        with self.ledger.write() as (tx, view):
            view.invalidate()
            known = {s.name for s in tx.queue_specs()}
            if name not in known:
                raise NotFound(
                    f"queue {name!r} does not exist (queues: {', '.join(sorted(known)) or 'none'}): "
                    "`gpupool queue list` shows them"
                )
            leases, tickets = tx.queue_busy(name)
            if leases or tickets:
                raise InvalidInput(
                    f"queue {name!r} still has {leases} lease(s) and {tickets} waiting claim(s): "
                    "delete it once they have ended"
                )
            tx.delete_queue(name)
        log.info("queue %s deleted", name)

    def usage(
        self, since: float, until: Optional[float] = None, by: str = "queue", holder: str = "", queue: str = ""
    ) -> List[UsageRow]:
        """GPU-seconds per queue, holder or label (`by`) over [since, until or now], most used first;
        `holder`, `queue` keep only that holder's or queue's leases (`gpupool usage --user/--queue`)."""
        from ..core.queues import check_usage_key  # lazily: a pool without queues never loads core.queues

        check_usage_key(by)
        now = self.clock()
        since = check_time(since, "since")
        end = now if until is None else check_time(until, "until")
        if end < since:
            raise InvalidInput(f"until {end!r} is before since {since!r}: give a window that ends after it starts")
        with self.store.read() as tx:
            memory_of = {d.uuid: d.memory_mib for d in self.ledger.devices(tx)}
            return accounting.usage(tx, memory_of, since, end, by, now, holder, queue)

    def history(self, since: float, until: Optional[float] = None) -> List[LeaseRecord]:
        """Each lease that ended in [since, until or now], in the order they ended."""
        from ..core.queues import LeaseRecord  # lazily: a pool that is only claimed from never lists it

        since = check_time(since, "since")
        end = self.clock() if until is None else check_time(until, "until")
        with self.store.read() as tx:
            return [LeaseRecord(*row) for row in tx.lease_records(since, end)]

    def watch(self, lease_id: str, timeout_s: float) -> Lease:
        """The lease as soon as its runner has a step to take (preempted, to park, to restore: see
        `Lease.needs_runner`), else after `timeout_s`; NotFound once it is gone, GpupoolError once
        the pool is closed (by another thread: the runner does not wait for its watch)."""
        timeout_s = check_seconds(timeout_s, "timeout_s", 0.0, MAX_WATCH_S)
        deadline = time.monotonic() + timeout_s
        while True:
            lease = self.watch_step(lease_id)
            remaining = deadline - time.monotonic()
            if lease.needs_runner or remaining <= 0:
                return lease
            if self._closed.wait(min(WATCH_POLL_S, remaining)):
                raise GpupoolError(f"the pool was closed while lease {lease_id} was watched")

    # --- suspend and resume (pool/suspend.py) ------------------------------------------
    def watch_step(self, lease_id: str) -> Lease:
        """One look at a watched lease: a suspended one that wants room takes it if it can."""
        lease = self.lease(lease_id)
        if lease.suspension is None or not lease.suspension.want_resume or lease.state != SUSPENDED:
            return lease
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, None, "resume")
            placed = suspend.try_place(
                tx,
                lease,
                view.devices,
                view.allocated,
                lambda ticket, claim: self._room_for(tx, view, ticket, claim, now),
                lambda claim: self._take_ticket(tx, claim, lease.holder, now),
                now,
                TICKET_TTL_S,
            )
            if placed is not None:
                view.invalidate()
                return placed
            view.tickets = None
            return lease

    def _room_for(self, tx: Tx, view: View, ticket: int, claim: Claim, now: float) -> Optional[Tuple[Slice, ...]]:
        """The slices `ticket` is granted now, as any waiting claim would be, or None."""
        if view.queues or claim.queue:
            return self._admit(tx, view, ticket, claim, now).slices
        if tx.head_ticket() != ticket:
            return None
        placement = place(view.devices, view.allocated, claim, self.mix.frag)
        return placement.slices if placement.fits else None

    def suspend(self, lease_id: str, requester: Optional[str] = None, reason: str = "", by: str = "") -> Lease:
        """Ask the lease's runner to park it (holder or admin; `requester` None acts as admin): it
        resumes on `resume`, not on its own. `by` says who asks (default: its owner or an admin)."""
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, requester, "suspend")
            by = by or (BY_ADMIN if requester is None or requester != lease.holder.name else BY_OWNER)
            return suspend.ask(tx, lease, by, reason or f"suspended by its {by}", False, now)

    def resume(self, lease_id: str, requester: Optional[str] = None) -> Lease:
        """A suspended lease takes room again as soon as there is some (holder or admin)."""
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, requester, "resume")
            lease = suspend.want_resume(tx, lease, now)
        return self.watch_step(lease.id)

    def report_parked(self, lease_id: str, requester: Optional[str], host_bytes: int = 0, error: str = "") -> Lease:
        """The runner's word on a suspend: parked (`host_bytes` in host memory), or `error`."""
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, requester, "report on")
            view.invalidate()  # its slices go
            if error:
                return suspend.park_failed(tx, lease, error, now)
            return suspend.parked(tx, lease, view.devices, host_bytes, now)

    def report_restored(self, lease_id: str, requester: Optional[str], error: str = "") -> Lease:
        """The runner's word on a resume: restored, or `error` (the lease stays suspended)."""
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, requester, "report on")
            if error:
                view.invalidate()  # its slices go back
                return suspend.restore_failed(tx, lease, error, now)
            return suspend.restored(tx, lease, now)

    def queue(self) -> List[QueuedClaim]:
        """The claims waiting in the FIFO queue, oldest first (live tickets only), for views and metrics."""
        from ..core.queues import QueuedClaim  # lazily: a run never lists the queue

        now = self.clock()
        with self.store.read() as tx:
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
        now = self.clock()
        with self.store.read() as tx:
            if queue and queue not in {spec.name for spec in tx.queue_specs()}:
                known = ", ".join(sorted(spec.name for spec in tx.queue_specs())) or "none"
                raise NotFound(f"queue {queue!r} does not exist (queues: {known}): `gpupool queue list` shows them")
            shown = self._waiting_in_order(tx, self.ledger.devices(tx), now, key)
        return [w for w in shown if queue is None or w.queue == queue]

    def _waiting_in_order(self, tx: Tx, devices: Sequence[Device], now: float, key: str = "") -> List[WaitingClaim]:
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

    def hold(self, claim_id: object, requester: Optional[str] = None) -> WaitingClaim:
        """Keep waiting claim `claim_id` (its ticket) in the queue but skip it in grants, until
        `unhold` (its holder or an admin; `requester` None acts as admin)."""
        return self._change_ticket(claim_id, requester, "hold", lambda tx, ticket: tx.set_ticket_held(ticket, True))

    def unhold(self, claim_id: object, requester: Optional[str] = None) -> WaitingClaim:
        """A held claim is granted again, in the place its ticket (its age and priority) gives it."""
        return self._change_ticket(claim_id, requester, "release", lambda tx, ticket: tx.set_ticket_held(ticket, False))

    def set_priority(self, claim_id: object, priority: object, requester: Optional[str] = None) -> WaitingClaim:
        """Change the priority of waiting claim `claim_id`: its order within its queue (and its lease's)."""
        value = check_priority(priority, InvalidInput)
        return self._change_ticket(
            claim_id, requester, "change the priority of", lambda tx, ticket: tx.set_ticket_priority(ticket, value)
        )

    def cancel_claim(self, claim_id: object, requester: Optional[str] = None) -> WaitingClaim:
        """Take waiting claim `claim_id` out of the queue (its holder or an admin; `requester` None
        acts as admin): its waiter's next poll raises ClaimCancelled naming who. Returns the claim
        as `waiting` listed it."""
        with self.ledger.step() as (tx, view, now):
            ticket, holder = _waiting_ticket(tx, claim_id, requester, "cancel")
            found = [w for w in self._waiting_in_order(tx, view.devices, now) if w.ticket == ticket]
            if not found:
                raise NotFound(_no_claim(claim_id))
            tx.delete_ticket(ticket)
            tx.set_meta(f"{CANCELLED_KEY}{ticket}", "an admin" if requester is None else f"its holder {requester!r}")
            view.tickets = None
        log.info("claim %d of %s cancelled by %s", ticket, holder, requester or "an admin")
        return found[0]

    def _change_ticket(
        self, claim_id: object, requester: Optional[str], verb: str, change: Callable[[Tx, int], None]
    ) -> WaitingClaim:
        """`change` the ticket of waiting claim `claim_id` in one transaction, its holder or an admin;
        NotFound (naming the id) when no such claim waits. Returns it as `waiting` lists it."""
        with self.ledger.step() as (tx, view, now):
            ticket, _holder = _waiting_ticket(tx, claim_id, requester, verb)
            change(tx, ticket)
            view.tickets = None
        log.info("claim %d: %s", ticket, verb)
        found = [w for w in self.waiting() if w.ticket == ticket]
        if not found:
            raise NotFound(_no_claim(claim_id))
        return found[0]

    def set_isolation(self, isolation: NodeIsolation) -> None:
        """Record how this node holds leases to their share (runners read it from status)."""
        with self.store.write() as tx:
            tx.set_meta(ISOLATION_KEY, json.dumps(isolation.to_dict()))

    def record_usage(self, report: UsageReport) -> None:
        """Keep `report` as the node's usage record (the watchdog writes it every sample)."""
        with self.store.write() as tx:
            tx.set_meta(USAGE_KEY, json.dumps(report.to_dict(), separators=(",", ":")))

    def devices(self) -> List[Device]:
        with self.store.read() as tx:
            return list(self.ledger.devices(tx))

    def set_device_health(self, health: Dict[str, bool]) -> None:
        """Mark devices healthy or not (device plugin); unhealthy ones get no new slices."""
        with self.ledger.write() as (tx, view):
            view.invalidate()  # the device list changed under it
            devices = tx.devices()
            tx.replace_devices([replace(d, healthy=health.get(d.uuid, d.healthy)) for d in devices])


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


def _note_reason(tx: Tx, waiter: Waiter) -> None:
    """Write why `waiter` waits to its ticket when that changed (status shows it)."""
    if waiter.reason != waiter.noted:
        tx.set_ticket_reason(waiter.ticket, waiter.reason[:MAX_REASON_CHARS])
        waiter.noted = waiter.reason


def _check_env_devices(state_dir: Path, saved: Sequence[Device], wanted: Sequence[Device]) -> None:
    """InvalidInput when $GPUPOOL_DEVICES names other devices than the state dir serves: an env
    variable left exported must not drop a pool's GPUs silently."""

    def shape(devices: Sequence[Device]) -> List[Tuple[str, str, int]]:
        return sorted((d.uuid, d.name, d.memory_mib) for d in devices)

    if saved and shape(saved) != shape(wanted):
        raise InvalidInput(
            f"$GPUPOOL_DEVICES names {_describe(wanted)} but {state_dir} serves {_describe(saved)}: unset "
            "GPUPOOL_DEVICES to keep serving them, or pass --devices SPEC to replace them"
        )


def _describe(devices: Sequence[Device]) -> str:
    names = sorted({d.name for d in devices})
    return f"{len(devices)} GPU(s) ({', '.join(names)})"


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


def _usage_report(text: Optional[str]) -> Optional[UsageReport]:
    """The watchdog's last report from its meta row (None before the first); core.usage is imported
    only then, as a pool without a watchdog (every embedded one) never needs it."""
    if not text:
        return None
    from ..core.usage import UsageReport

    return UsageReport.from_dict(json.loads(text))
