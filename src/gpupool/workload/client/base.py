"""The one interface every pool client implements (HTTP or embedded)."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, TypeVar

from ...core import operations as ops
from ...core.model import Claim, Holder, Lease
from ...core.operations import Operation
from ...core.status import PoolStatus, WaitingClaim

if TYPE_CHECKING:  # types only: `gpupool run` imports this module and never needs the queue classes
    from typing import List, Optional

    from ...core.attestation import AttestTicket
    from ...core.queues import LeaseRecord, QueueSpec, QueueStatus, UsageRow

A = TypeVar("A")


class PoolClient(abc.ABC):
    """Claim, heartbeat, release and inspect leases of one pool: every operation of
    `core.operations`, through one `call` (HTTP, or the pool in-process).

    Errors are raised as `gpupool.core.errors.GpupoolError` subclasses:
    `InvalidClaim`/`Unsatisfiable` for claims that can never be granted,
    `Unavailable` when it does not fit within `wait_s`, `NotFound`,
    `Forbidden`, `Unauthorized`, `ServerUnreachable`.
    """

    #: where this pool lives: a URL, or "embedded:<state dir>"
    address: str = ""

    @abc.abstractmethod
    def call(self, op: Operation[A], **args: Any) -> A:
        """Answer operation `op` (`core.operations`) with `args`: the one method a client writes.

        The methods below are each one call; a verb without one is called as
        `client.call(operations.VERB, name=value, ...)`.
        """

    def claim(self, claim: Claim, holder: Holder, *, wait_s: float = 0.0, ttl_s: float = 30.0, key: str = "") -> Lease:
        """Grant `claim` to `holder`, waiting in the FIFO queue up to `wait_s` seconds; `key`
        (core.outage.new_key, the same in each try of one claim) makes a retry find what an earlier
        try got: the lease granted to it, or its place in the queue."""
        return self.call(ops.CLAIM, claim=claim, holder=holder, wait_s=wait_s, ttl_s=ttl_s, key=key)

    def heartbeat(self, lease_id: str) -> Lease:
        """Extend the lease by its TTL; returns the lease with its new expiry."""
        return self.call(ops.HEARTBEAT, lease_id=lease_id)

    def release(self, lease_id: str, exit_code: Optional[int] = None, timed_out: bool = False) -> None:
        """Give the lease's memory back to the pool; `exit_code` (0-255) is its command's, kept in
        the lease history as the holder's word; `timed_out`: ended at its time limit (`timeout`)."""
        self.call(ops.RELEASE, lease_id=lease_id, exit_code=exit_code, timed_out=timed_out)

    def status(self) -> PoolStatus:
        """Devices, their allocation, and the live leases."""
        return self.call(ops.STATUS)

    def get_lease(self, lease_id: str) -> Lease:
        """One live lease by id (NotFound when it expired or was released)."""
        return self.call(ops.GET_LEASE, lease_id=lease_id)

    def watch(self, lease_id: str, timeout_s: float) -> Lease:
        """The lease as soon as its runner has a step to take (`Lease.needs_runner`: preempted, to
        park, to restore), else after `timeout_s`; NotFound when it is gone. A server bounds
        `timeout_s` to (0, 60]."""
        return self.call(ops.WATCH, lease_id=lease_id, timeout_s=timeout_s)

    def suspend(self, lease_id: str, reason: str = "") -> Lease:
        """Ask the lease's runner to park it (holder or admin): its GPU memory goes back to the pool
        once parked, and it comes back on `resume`."""
        return self.call(ops.SUSPEND, lease_id=lease_id, reason=reason)

    def resume(self, lease_id: str) -> Lease:
        """A suspended lease takes room again as soon as there is some (holder or admin)."""
        return self.call(ops.RESUME, lease_id=lease_id)

    def report_parked(self, lease_id: str, host_bytes: int = 0, error: str = "") -> Lease:
        """The runner's word on a suspend it was asked for: parked, or `error`."""
        return self.call(ops.PARKED, lease_id=lease_id, host_bytes=host_bytes, error=error)

    def report_restored(self, lease_id: str, error: str = "") -> Lease:
        """The runner's word on a resume: restored, or `error` (the lease stays suspended)."""
        return self.call(ops.RESTORED, lease_id=lease_id, error=error)

    def queues(self) -> List[QueueStatus]:
        """Every queue with its quota, weight, limit and what it holds and waits for now."""
        return self.call(ops.QUEUES)

    def set_queue(self, spec: QueueSpec) -> QueueStatus:
        """Create or update a queue (admin); InvalidInput when the quotas would sum above the pool."""
        return self.call(ops.SET_QUEUE, name=spec.name, spec=spec)

    def delete_queue(self, name: str) -> None:
        """Remove a queue (admin); NotFound, or InvalidInput while it holds leases or waiting claims."""
        self.call(ops.DELETE_QUEUE, name=name)

    def usage(
        self, since: float, until: Optional[float] = None, by: str = "queue", user: str = "", queue: str = ""
    ) -> List[UsageRow]:
        """GPU-seconds used between epoch seconds `since` and `until` (default now), per queue,
        holder or label (`core.queues.USAGE_KEYS`); `user`, `queue` keep that holder's, that queue's."""
        return self.call(ops.USAGE, since=since, until=until, by=by, user=user, queue=queue)

    def history(self, since: float, until: Optional[float] = None) -> List[LeaseRecord]:
        """Each lease that ended between epoch seconds `since` and `until` (default now)."""
        return self.call(ops.HISTORY, since=since, until=until)

    def waiting(self, queue: Optional[str] = None, key: str = "") -> List[WaitingClaim]:
        """The waiting claims in the order the pool grants them, each with why it waits (held ones
        last); `queue` keeps one queue's, `key` the claim with that client key."""
        return self.call(ops.WAITING, queue=queue, key=key)

    def hold_claim(self, claim_id: str) -> WaitingClaim:
        """Keep a waiting claim in the queue but skip it in grants (its holder or an admin)."""
        return self.call(ops.HOLD_CLAIM, claim_id=claim_id)

    def release_claim(self, claim_id: str) -> WaitingClaim:
        """Let grants take a held claim again, in the place its ticket gives it."""
        return self.call(ops.RELEASE_CLAIM, claim_id=claim_id)

    def set_claim_priority(self, claim_id: str, priority: int) -> WaitingClaim:
        """Change a waiting claim's priority: its order within its queue."""
        return self.call(ops.CLAIM_PRIORITY, claim_id=claim_id, priority=priority)

    def attest_ticket(self, lease_id: str) -> Optional[AttestTicket]:
        """The key and node socket to attest a lease this client claimed; None where no watchdog
        attributes processes (the embedded pool), AttestTicket('', '') when the server gave none."""
        return None

    def close(self) -> None:  # noqa: B027  # optional hook: most clients have nothing to free
        """Free connections or files; the default has nothing to free."""

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
