"""`Pool`: the face of the pool of one state dir, whose parts each keep one concern.

The parts (each a module of pool/), sharing one `Ledger`:
- ledger.py: the transaction state and checks every verb shares (each thread's view of the
  database, the write + expiry preamble, who may act on a lease);
- claims.py: claims granted now or by polling a ticket, heartbeats, releases (`pool.claims`);
- tickets.py: the waiting claims: `Waiter`, the poll backoff, hold, priority, cancel (`pool.tickets`);
- watch.py: a runner's watch of its lease, and the resume placement it makes (`pool.watcher`);
- suspend.py: suspend, resume and the runner's reports (`pool.suspensions`);
- accounting.py: queues, usage and the lease history (`pool.accounts`);
- admission.py: who goes next once queues exist, whom to preempt; renewal.py: a server's start.
`Pool` forwards the verbs its callers use (the servers, the embedded client, the CLI); the
waiter protocol of the HTTP server (`pool.claims.begin`, `try_grant`, `cancel`, `timed_out`) and
`pool.watcher.step` are reached through the parts.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput
from ...core.isolation_mode import NodeIsolation
from ...core.model import DEFAULT_PREEMPT_GRACE_S, MAX_PREEMPT_GRACE_S, Claim, Device, Holder, Lease
from ...core.model import MAX_TTL_S as MAX_TTL_S  # the limits live in core; importers of the pool keep them
from ...core.model import MAX_WAIT_S as MAX_WAIT_S
from ...core.model import MIN_TTL_S as MIN_TTL_S
from ...core.outage import TICKET_REATTACH_S
from ...core.status import PoolStatus, WaitingClaim
from ...core.suspension import DEFAULT_PREEMPT_MODE, check_preempt_mode
from ...logs import get_logger
from ..devices.health import is_emulated
from ..isolation.emulated_usage import DEFAULT_USAGE_FILE
from ..store import Store
from . import accounting
from .accounting import Accounts
from .claims import DEFAULT_TTL_S as DEFAULT_TTL_S
from .claims import HISTOGRAM_KEY as HISTOGRAM_KEY
from .claims import Claims
from .ledger import Ledger, check_seconds
from .suspend import Suspensions
from .tickets import TICKET_TTL_S as TICKET_TTL_S
from .tickets import Tickets
from .tickets import Waiter as Waiter
from .tickets import poll_delays as poll_delays
from .tickets import waiter_pauses as waiter_pauses
from .watch import Watch

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

    from ...core.queues import LeaseRecord, QueueSpec, QueueStatus, UsageRow
    from ...core.usage import UsageReport

log = get_logger(__name__)

# The lease history (usage accounting) keeps what ended in the last 90 days; the expiry sweep
# of a long-lived pool (the server's, the agent's) deletes older rows once an hour.
HISTORY_RETENTION_S = 90 * 86400.0
HISTORY_PRUNE_EVERY_S = 3600.0
# meta keys of the node-wide records every view reads
ISOLATION_KEY = "isolation"
USAGE_KEY = "usage"


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
            open renews what was live when the last server stopped, its sweeps stamp it (pool/renewal.py).
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
        # the transaction state every part shares (pool/ledger.py)
        self.ledger = Ledger(self.store, clock, os.uname().nodename)
        try:
            self.claims = Claims(self.ledger, self.preempt_grace_s, self.preempt_mode)
            self.mix = self.claims.mix  # fragaware's mix, learned from the claims seen
            self.tickets = Tickets(self.ledger, self.mix)
            self.watcher = Watch(self.ledger, self.claims, serving)
            self.suspensions = Suspensions(self.ledger, self.watcher)
            self.accounts = Accounts(self.ledger, self.preempt_mode)
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
                self._renew()
        except BaseException:
            self.store.close()  # no pool to close it later: NVML missing must not leak connections
            raise

    @classmethod
    def open(cls, state_dir: Union[str, Path], **kwargs: Any) -> Pool:
        return cls(state_dir, **kwargs)

    def _renew(self) -> None:
        """A server's start: renew what was live when the last server stopped (pool/renewal.py)."""
        from .renewal import renew  # lazily: only a server renews; a run's embedded pool never loads it

        with self.store.write() as tx:
            renewed = renew(tx, self.clock())
        if renewed.leases or renewed.tickets:
            log.warning(
                "back after %.1f s without a server: %d lease(s) renewed for a full TTL, %d waiting claim(s) "
                "keep their place for %g s, %d preemption(s) with no claim left waiting undone",
                renewed.down_s,
                renewed.leases,
                renewed.tickets,
                TICKET_REATTACH_S,
                renewed.undone,
            )

    def close(self) -> None:
        self.watcher.close()  # ends the watches of other threads and of event loops
        self.store.close()

    # --- claims and leases (pool/claims.py) ---------------------------------------
    def claim(
        self, claim: Claim, holder: Holder, wait_s: float = 0.0, ttl_s: float = DEFAULT_TTL_S, key: str = ""
    ) -> Lease:
        """Grant `claim` to `holder` now, or wait in the queue up to `wait_s` seconds (`Claims.claim`)."""
        return self.claims.claim(claim, holder, wait_s, ttl_s, key)

    def heartbeat(self, lease_id: str, requester: Optional[str] = None) -> Lease:
        """Extend the lease by its TTL from now; `requester` None acts as admin."""
        return self.claims.heartbeat(lease_id, requester)

    def release(
        self,
        lease_id: str,
        requester: Optional[str] = None,
        exit_code: Optional[int] = None,
        caller: Optional[str] = None,
        timed_out: bool = False,
    ) -> None:
        """Give the lease's memory back (`Claims.release` says who is recorded as releasing it)."""
        self.claims.release(lease_id, requester, exit_code, caller, timed_out)

    def lease(self, lease_id: str) -> Lease:
        """One live lease; NotFound when released or expired."""
        return self.claims.lease(lease_id)

    def expire(self) -> List[Lease]:
        """Reclaim leases past their expiry and drop dead waiters; returns the reclaimed leases."""
        # Not through the view: the sweep runs in threads that serve no claims, where
        # rebuilding a view (a SUM over every slice) under the write lock would be wasted.
        with self.store.write() as tx:
            now = self.clock()
            if self.serving:  # what the next start renews (pool/renewal.py)
                from .renewal import stamp_alive  # lazily, as in _renew

                stamp_alive(tx, now)
            if now >= self._next_history_prune:
                tx.prune_history(now - HISTORY_RETENTION_S)
                self._next_history_prune = now + HISTORY_PRUNE_EVERY_S
            return self.ledger.expire(tx, now)

    # --- waiting claims (pool/tickets.py) -------------------------------------------
    def waiting(self, queue: Optional[str] = None, key: str = "") -> List[WaitingClaim]:
        """The live waiting claims in the order the pool grants them (`Tickets.waiting`)."""
        return self.tickets.waiting(queue, key)

    def hold(self, claim_id: object, requester: Optional[str] = None) -> WaitingClaim:
        """Keep waiting claim `claim_id` in the queue but skip it in grants, until `unhold`."""
        return self.tickets.hold(claim_id, requester, held=True)

    def unhold(self, claim_id: object, requester: Optional[str] = None) -> WaitingClaim:
        """A held claim is granted again, in the place its ticket (its age and priority) gives it."""
        return self.tickets.hold(claim_id, requester, held=False)

    def set_priority(self, claim_id: object, priority: object, requester: Optional[str] = None) -> WaitingClaim:
        """Change the priority of waiting claim `claim_id`: its order within its queue (and its lease's)."""
        return self.tickets.set_priority(claim_id, priority, requester)

    def cancel_claim(self, claim_id: object, requester: Optional[str] = None) -> WaitingClaim:
        """Take waiting claim `claim_id` out of the queue; its waiter's next poll raises ClaimCancelled."""
        return self.tickets.cancel(claim_id, requester)

    # --- watch and suspension (pool/watch.py, pool/suspend.py) -----------------------
    def watch(self, lease_id: str, timeout_s: float) -> Lease:
        """The lease as soon as its runner has a step to take, else after `timeout_s` (`Watch.watch`)."""
        return self.watcher.watch(lease_id, timeout_s)

    def suspend(self, lease_id: str, requester: Optional[str] = None, reason: str = "", by: str = "") -> Lease:
        """Ask the lease's runner to park it (holder or admin); it resumes on `resume`."""
        return self.suspensions.suspend(lease_id, requester, reason, by)

    def resume(self, lease_id: str, requester: Optional[str] = None) -> Lease:
        """A suspended lease takes room again as soon as there is some (holder or admin)."""
        return self.suspensions.resume(lease_id, requester)

    def report_parked(self, lease_id: str, requester: Optional[str], host_bytes: int = 0, error: str = "") -> Lease:
        """The runner's word on a suspend: parked (`host_bytes` in host memory), or `error`."""
        return self.suspensions.report_parked(lease_id, requester, host_bytes, error)

    def report_restored(self, lease_id: str, requester: Optional[str], error: str = "") -> Lease:
        """The runner's word on a resume: restored, or `error` (the lease stays suspended)."""
        return self.suspensions.report_restored(lease_id, requester, error)

    # --- queues and accounting (pool/accounting.py) ------------------------------------
    def queues(self) -> List[QueueStatus]:
        """Every queue with what it holds, borrows and waits for."""
        return self.accounts.queues()

    def queue_specs(self) -> List[QueueSpec]:
        """The queues' definitions alone (no load read): what the watchdog's idle reclaim needs."""
        return self.accounts.queue_specs()

    def set_queue(self, spec: QueueSpec) -> QueueStatus:
        """Create or update a queue; InvalidInput when the quotas would sum above the pool's GPUs."""
        return self.accounts.set_queue(spec)

    def delete_queue(self, name: str) -> None:
        """Delete a queue; NotFound when there is none, InvalidInput while it has leases or waiting claims."""
        self.accounts.delete_queue(name)

    def usage(
        self, since: float, until: Optional[float] = None, by: str = "queue", holder: str = "", queue: str = ""
    ) -> List[UsageRow]:
        """GPU-seconds per queue, holder or label (`by`) over [since, until or now], most used first."""
        return self.accounts.usage(since, until, by, holder, queue)

    def history(self, since: float, until: Optional[float] = None) -> List[LeaseRecord]:
        """Each lease that ended in [since, until or now], in the order they ended."""
        return self.accounts.history(since, until)

    # --- the node: status, devices, records ----------------------------------------------
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
            listed = self.tickets.in_order(tx, devices, now) if waiting else []
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


def _usage_report(text: Optional[str]) -> Optional[UsageReport]:
    """The watchdog's last report from its meta row (None before the first); core.usage is imported
    only then, as a pool without a watchdog (every embedded one) never needs it."""
    if not text:
        return None
    from ...core.usage import UsageReport

    return UsageReport.from_dict(json.loads(text))
