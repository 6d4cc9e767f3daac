"""The watch of a lease by its runner: the one place a runner learns that it has a step to take.

A runner long-polls `Watch.watch` (GET /v1/leases/{id}?watch=S, or in process): the lease comes
back as soon as it is preempted, asked to park or given room to restore (`Lease.needs_runner`).
The watch is told, not polling: every write transaction names the leases it changed (store.tx's
`Tx.changed`) and, once committed, the store bumps them on this watch's `LeaseBoard`
(pool/notify.py), which wakes their watches, a thread's (`watch`) or the server's event loop's
(`watch_async`). On an embedded pool other processes write the state dir too: there the commit
also rings the doorbells (pool/doorbell.py) its leases' watches hang, in any process. The re-read
of the lease from SQLite stays as the fallback: every WATCH_FALLBACK_S in a serving pool (whose
state dir no other process writes), every WATCH_POLL_S in an embedded one.
`Watch.step` is one look, a read: a suspended lease that wants room is given it by the writes
(`Suspensions.place_waiting`, after every write of the ledger), whose commit wakes its watch.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence, Set

from ...core.errors import GpupoolError
from ...core.model import Lease
from . import doorbell
from .ledger import check_seconds
from .notify import LeaseBoard

if TYPE_CHECKING:
    from .claims import Claims
    from .ledger import Ledger

# An embedded pool's watch reads the lease this often (other processes write the state dir).
WATCH_POLL_S = 0.1
# A serving pool's watch reads the lease this often when no write of this process names it: the
# fallback for a write the board does not see (this process writes everything the state dir gets).
WATCH_FALLBACK_S = 1.0
MAX_WATCH_S = 3600.0
# How often the server's watch asks whether its client has gone (each ask reads the connection).
WATCH_DISCONNECT_CHECK_S = 1.0


class Watch:
    """The watches of one pool's leases; `close` (when the pool closes) ends them all. `serving`: the
    pool is a server's, the only process that writes its state dir (the fallback re-read is rare)."""

    def __init__(self, ledger: Ledger, claims: Claims, serving: bool = False) -> None:
        self.ledger = ledger
        self.claims = claims
        self.closed = threading.Event()
        self.board = LeaseBoard()
        # Other processes' watches, on an embedded pool's state dir: rung after each commit too.
        self.doorbells: Optional[Path] = None if serving else ledger.store.state_dir
        self._bells: Set[doorbell.Doorbell] = set()  # hung now, to wake at close
        ledger.store.on_commit = self._committed  # the one notification path: every committed write
        self.fallback_s = WATCH_FALLBACK_S if serving else WATCH_POLL_S

    def _committed(self, lease_ids: Sequence[str]) -> None:
        self.board.bump(lease_ids)
        if self.doorbells is not None:
            doorbell.ring(self.doorbells, lease_ids)

    @contextlib.contextmanager
    def _doorbell(self, lease_id: str) -> Iterator[Optional[doorbell.Doorbell]]:
        bell = doorbell.hang(self.doorbells, lease_id) if self.doorbells is not None else None
        if bell is not None:
            self._bells.add(bell)
        try:
            yield bell
        finally:
            if bell is not None:
                self._bells.discard(bell)
                bell.close()

    def close(self) -> None:
        """End every watch, of threads and of event loops."""
        self.closed.set()
        self.board.close()
        for bell in list(self._bells):
            bell.poke()

    def _wait_s(self, lease: Lease, remaining: float) -> float:
        """How long a watch that saw `lease` waits for its notification before it reads it again."""
        return max(0.0, min(self.fallback_s, remaining))

    def watch(self, lease_id: str, timeout_s: float) -> Lease:
        """The lease as soon as its runner has a step to take (preempted, to park, to restore: see
        `Lease.needs_runner`), else after `timeout_s`; NotFound once it is gone, GpupoolError once
        the pool is closed (by another thread: the runner does not wait for its watch)."""
        timeout_s = check_seconds(timeout_s, "timeout_s", 0.0, MAX_WATCH_S)
        deadline = time.monotonic() + timeout_s
        with self.board.watch(lease_id) as subscription, self._doorbell(lease_id) as bell:
            while True:
                seen = subscription.seen()  # before the read: a write after it wakes the wait below
                if bell is not None:
                    bell.drain()  # likewise: a ring during the read stays to wake the wait
                lease = self.step(lease_id)
                remaining = deadline - time.monotonic()
                if lease.needs_runner or remaining <= 0:
                    return lease
                if bell is None:
                    subscription.wait(seen, self._wait_s(lease, remaining))
                else:  # this process's writes ring it as well
                    with self.board.blocked():
                        bell.wait(self._wait_s(lease, remaining))
                if self.closed.is_set():
                    raise GpupoolError(f"the pool was closed while lease {lease_id} was watched")

    async def watch_async(self, lease_id: str, timeout_s: float, disconnected: Any) -> Lease:
        """`watch` for the server's event loop: no thread is held per watch; each look at the lease
        is one small SQLite read, inline. Returns early once `await disconnected()` says the client
        has gone (asked every WATCH_DISCONNECT_CHECK_S): nobody reads the answer."""
        deadline = time.monotonic() + timeout_s
        next_check = time.monotonic() + WATCH_DISCONNECT_CHECK_S
        with self.board.watch(lease_id) as subscription:
            while True:
                seen = subscription.seen()
                lease = self.step(lease_id)
                now = time.monotonic()
                if lease.needs_runner or now >= deadline:
                    return lease
                read_again = now + self._wait_s(lease, deadline - now)
                while True:  # asking after the client reads nothing: only a bump or the fallback does
                    if now >= next_check:
                        if await disconnected():
                            return lease
                        next_check = now + WATCH_DISCONNECT_CHECK_S
                    woken = await subscription.wait_async(seen, max(0.0, min(read_again, next_check) - now))
                    if self.closed.is_set():
                        raise GpupoolError(f"the pool was closed while lease {lease_id} was watched")
                    now = time.monotonic()
                    if woken or now >= read_again:
                        break

    def step(self, lease_id: str) -> Lease:
        """One look at a watched lease (a read: resume placement is the writes', pool/suspend.py)."""
        return self.claims.lease(lease_id)
