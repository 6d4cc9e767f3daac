"""The watch of a lease by its runner: the one place a runner learns that it has a step to take.

A runner long-polls `Watch.watch` (GET /v1/leases/{id}/watch, or in process): the lease comes back
as soon as it is preempted, asked to park or given room to restore (`Lease.needs_runner`). Today
the lease is read again every WATCH_POLL_S; `Watch.step` is one look, and places a suspended lease
that wants room (a write: its resume placement). Where the writes that change a lease's state
happen: /work/notes/pool-split.md and docs/architecture/claim.md.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ..core.errors import GpupoolError
from ..core.model import SUSPENDED, Lease
from . import suspend
from .ledger import check_seconds
from .tickets import TICKET_TTL_S, take_ticket

if TYPE_CHECKING:
    from .claims import Claims
    from .ledger import Ledger

# Watch reads the lease this often.
WATCH_POLL_S = 0.1
MAX_WATCH_S = 3600.0


class Watch:
    """The watches of one pool's leases; `closed` (set when the pool closes) ends them all."""

    def __init__(self, ledger: Ledger, claims: Claims) -> None:
        self.ledger = ledger
        self.claims = claims
        self.closed = threading.Event()

    def watch(self, lease_id: str, timeout_s: float) -> Lease:
        """The lease as soon as its runner has a step to take (preempted, to park, to restore: see
        `Lease.needs_runner`), else after `timeout_s`; NotFound once it is gone, GpupoolError once
        the pool is closed (by another thread: the runner does not wait for its watch)."""
        timeout_s = check_seconds(timeout_s, "timeout_s", 0.0, MAX_WATCH_S)
        deadline = time.monotonic() + timeout_s
        while True:
            lease = self.step(lease_id)
            remaining = deadline - time.monotonic()
            if lease.needs_runner or remaining <= 0:
                return lease
            if self.closed.wait(min(WATCH_POLL_S, remaining)):
                raise GpupoolError(f"the pool was closed while lease {lease_id} was watched")

    def step(self, lease_id: str) -> Lease:
        """One look at a watched lease: a suspended one that wants room takes it if it can."""
        lease = self.claims.lease(lease_id)
        if lease.suspension is None or not lease.suspension.want_resume or lease.state != SUSPENDED:
            return lease
        with self.ledger.step() as (tx, view, now):
            lease = self.ledger.owned(tx, lease_id, None, "resume")
            placed = suspend.try_place(
                tx,
                lease,
                view.devices,
                view.allocated,
                lambda ticket, claim: self.claims.room_for(tx, view, ticket, claim, now),
                lambda claim: take_ticket(tx, claim, lease.holder, self.ledger.host, now),
                now,
                TICKET_TTL_S,
            )
            if placed is not None:
                view.invalidate()
                return placed
            view.tickets = None
            return lease
