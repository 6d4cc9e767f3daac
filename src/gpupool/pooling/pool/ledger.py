"""The ledger: the transaction state every pool verb shares, and the checks they all make.

Every state change is one SQLite transaction (BEGIN IMMEDIATE), and every one first reclaims
expired leases and dead waiters (`Ledger.step`: the preamble written once), so several processes
on one state dir (the embedded `gpupool run`s of a workstation, or a server and its admin CLI)
need nothing but the database to agree.

Speed: each thread keeps a `View` of what its connection last saw (devices, MiB allocated per
device, queue length, a lower bound of the next expiry). It is checked at the start of every
transaction against PRAGMA data_version (which moves when any other connection commits) and the
store's count of this connection's commits, and rebuilt from the database when either moved, so a
claim is BEGIN IMMEDIATE + two INSERTs + COMMIT, never a stale answer.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import Forbidden, InvalidClaim, InvalidInput, NotFound
from ...core.model import Device, Lease
from ...core.suspension import BY_ADMIN, BY_OWNER
from ...logs import get_logger
from ..isolation.proctree import alive
from ..store import Store
from ..store.tx import Tx

if TYPE_CHECKING:
    from typing import Callable, Dict, Iterator, List, Optional, Tuple

    from ...core.queues import QueueSpec

log = get_logger(__name__)


@dataclass
class View:
    """What one connection knows of the database, valid while `version` and `commits` hold."""

    conn: object
    version: int  # PRAGMA data_version when built or last checked
    commits: int  # Store.commits() after the last transaction that kept this view up to date
    devices: List[Device]
    allocated: Dict[str, int]
    tickets: Optional[int]  # queue length; None: ask the database
    next_expiry: float  # no lease expires before this (a lower bound: may be early, never late)
    queues: Dict[str, QueueSpec]  # the queues defined; empty: the FIFO path, as before queues
    valid: bool = True  # False: dropped at commit, so the next transaction rebuilds it

    def invalidate(self) -> None:
        """Drop this view after the transaction: it wrote something the view does not follow."""
        self.valid = False


class Ledger:
    """The store, the clock and each thread's view, shared by the parts of one `Pool`."""

    def __init__(self, store: Store, clock: Callable[[], float], host: str) -> None:
        self.store = store
        self.clock = clock
        self.host = host  # this host's name: a ticket of a dead pid here is dropped at once
        self._devices_cache: Tuple[int, List[Device]] = (-1, [])
        self._local = threading.local()  # this thread's View
        # Run at the end of every write, in its transaction: the pool's resume placement
        # (Suspensions.place_waiting), which room given back or a queue moved on may let in.
        self.after_write: Optional[Callable[[Tx, View], None]] = None

    @contextmanager
    def write(self) -> Iterator[Tuple[Tx, View]]:
        """store.write() with this connection's view, checked (or rebuilt) inside the transaction.

        The view may only be changed to follow what the transaction wrote; when the
        transaction fails it is dropped, as is one another writer made stale.
        """
        with self.store.write() as tx:
            view: Optional[View] = getattr(self._local, "view", None)
            version = tx.data_version()
            if (
                view is None
                or view.conn is not tx.conn
                or view.version != version
                or view.commits != self.store.commits()
            ):
                devices = list(self.devices(tx))
                view = View(
                    tx.conn,
                    version,
                    -1,
                    devices,
                    tx.allocated(),
                    None,
                    tx.next_expiry(),
                    {spec.name: spec for spec in tx.queue_specs()},
                )
            self._local.view = None  # until the commit: a failure anywhere leaves no half-updated view
            yield tx, view
            if self.after_write is not None:
                self.after_write(tx, view)
        view.commits = self.store.commits()
        self._local.view = view if view.valid else None

    @contextmanager
    def step(self) -> Iterator[Tuple[Tx, View, float]]:
        """The preamble of every verb that changes leases or tickets: `write()`, the time, and `due()`."""
        with self.write() as (tx, view):
            now = self.clock()
            self.due(tx, view, now)
            yield tx, view, now

    def due(self, tx: Tx, view: View, now: float) -> List[Lease]:
        """Reclaim expired leases and drop dead waiters, when the view says there may be any."""
        if view.tickets is None:
            view.tickets = tx.ticket_count()
        if now < view.next_expiry and view.tickets == 0:
            return []
        expired = self.expire(tx, now)
        for lease in expired:
            for sl in lease.slices:
                view.allocated[sl.device_uuid] = view.allocated.get(sl.device_uuid, 0) - sl.memory_mib
        view.next_expiry = tx.next_expiry()
        view.tickets = None
        return expired

    def expire(self, tx: Tx, now: float) -> List[Lease]:
        """End the leases past their expiry (in the history) and drop the tickets of dead waiters."""
        expired: List[Lease] = []
        if tx.has_expired_leases(now):
            expired = tx.leases("expires_at < ?", (now,))
            for lease in expired:
                # ended when its expiry (or reaping) came, not when a transaction noticed
                tx.record_end(lease.id, lease.expires_at, "expired" if lease.preempted_at is None else "preempted")
                tx.delete_lease(lease.id)
                if lease.preempted_at is not None:
                    log.warning(
                        "lease %s of %s preempted and not released within %g s; reaped",
                        lease.id,
                        lease.holder.describe(),
                        lease.preempt_grace_s,
                    )
                    continue
                log.warning(
                    "lease %s of %s expired (no heartbeat for %g s); memory reclaimed",
                    lease.id,
                    lease.holder.describe(),
                    lease.ttl_s,
                )
        for ticket, host, pid, expires_at in tx.tickets():
            # A ticket without a pid (<= 0) is only ever dropped by its expiry.
            if expires_at < now or (host == self.host and pid > 0 and not alive(pid)):
                tx.delete_ticket(ticket)
                log.info("dropped ticket %d of a waiter that is gone", ticket)
        return expired

    def devices(self, tx: Tx) -> List[Device]:
        """The devices, read again only when their generation moved."""
        gen = tx.devices_generation()
        cached_gen, cached = self._devices_cache
        if gen != cached_gen:
            cached = tx.devices()
            self._devices_cache = (gen, cached)
        return cached

    def owned(self, tx: Tx, lease_id: str, requester: Optional[str], verb: str) -> Lease:
        """Lease `lease_id`, where `requester` (None: an admin) may `verb` it: NotFound saying how it
        ended, Forbidden naming both holders."""
        lease = tx.get_lease(str(lease_id))
        if lease is None:
            raise NotFound(ended(tx, lease_id))
        if requester is not None and requester != lease.holder.name:
            raise Forbidden(
                f"lease {lease.id} is held by {lease.holder.name!r}, not {requester!r}: "
                f"only its holder or an admin token may {verb} it"
            )
        return lease


def gone(lease_id: object) -> str:
    return f"lease {lease_id!r} does not exist: it was released, or it expired because no heartbeat came within its TTL"


def ended(tx: Tx, lease_id: object) -> str:
    """Why there is no lease `lease_id`, as the history says how it ended and who ended it (what a
    runner tells its user when its lease ends under its command); `gone` where it has no record."""
    how = tx.how_ended(str(lease_id))
    if how is None:
        return gone(lease_id)
    reason, by, holder = how
    if reason == "revoked":
        return f"lease {lease_id!r} ended: its token {holder!r} was revoked by an admin"
    if reason == "expired":
        return f"lease {lease_id!r} expired: no heartbeat came within its TTL"
    if reason == "preempted":
        return f"lease {lease_id!r} was preempted and not released within its grace, so the pool reaped it"
    if by == BY_OWNER:
        return f"lease {lease_id!r} was released by its owner ({holder!r})"
    return f"lease {lease_id!r} was released" + (" by an admin" if by == BY_ADMIN else "")


def check_time(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{what} {value!r} must be a time in seconds since the epoch (e.g. time.time() - 86400)")
    return float(value)


def check_seconds(value: object, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidClaim(f"{what} {value!r} must be a number of seconds")
    if not low <= value <= high:
        raise InvalidClaim(f"{what} {value!r} must be between {low:g} and {high:g} seconds")
    return float(value)
