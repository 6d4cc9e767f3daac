"""The embedded pool client: the Pool service of gpupool.pool, in-process, on a state dir.

No server needed: several `gpupool run` processes on one machine share the
pool through the SQLite store in the state dir.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.isolation_mode import IsolationMode, NodeIsolation
from ..core.model import Claim, Device, Holder, Lease, local_user
from ..core.status import PoolStatus, WaitingClaim
from ..logs import get_logger
from .base import PoolClient

if TYPE_CHECKING:  # types only: the workload path never needs the queue classes
    from typing import List, Optional, Sequence

    from ..core.queues import LeaseRecord, QueueSpec, QueueStatus, UsageRow

log = get_logger(__name__)

STATE_ENV = "GPUPOOL_STATE"


def default_state_dir() -> Path:
    """`$GPUPOOL_STATE`, else `$XDG_STATE_HOME/gpupool`, else `~/.local/state/gpupool`."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "gpupool"


class EmbeddedPoolClient(PoolClient):
    """Calls `gpupool.pool.Pool` directly; the local user is the admin of their own state dir."""

    def __init__(
        self,
        state_dir: Optional[Path] = None,
        devices: Optional[Sequence[Device]] = None,
        node: str = "",
        isolation: Optional[IsolationMode] = None,
        devices_from_env: bool = False,
    ) -> None:
        from ..pool import Pool  # imported here: the pool is only needed without a server

        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.address = f"embedded:{self.state_dir}"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._pool = Pool.open(
            self.state_dir,
            devices=list(devices) if devices is not None else None,
            node=node,
            devices_from_env=devices_from_env,
        )
        try:
            if isolation is IsolationMode.MPS:
                from ..isolation.mps import ensure_detached

                # No process of the embedded pool lives long: its MPS daemon stays as pool infrastructure.
                self._pool.set_isolation(ensure_detached(self.state_dir))
            elif isolation is not None:
                self._pool.set_isolation(NodeIsolation(isolation))
        except BaseException:
            self._pool.close()
            raise

    def claim(self, claim: Claim, holder: Holder, *, wait_s: float = 0.0, ttl_s: float = 30.0, key: str = "") -> Lease:
        return self._pool.claim(claim, holder, wait_s=wait_s, ttl_s=ttl_s, key=key)

    def heartbeat(self, lease_id: str) -> Lease:
        return self._pool.heartbeat(lease_id)

    def release(self, lease_id: str, exit_code: Optional[int] = None, timed_out: bool = False) -> None:
        # As the admin of the state dir, in the name of the local user: its own lease's owner.
        self._pool.release(lease_id, None, exit_code, local_user(), timed_out)

    def status(self) -> PoolStatus:
        # The pool leaves expired leases out of its status and reclaims them on
        # the next write, so no reaper is needed without a server.
        return self._pool.status()

    def get_lease(self, lease_id: str) -> Lease:
        """One lease by id (NotFound when it expired or was released)."""
        return self._pool.lease(lease_id)

    def watch(self, lease_id: str, timeout_s: float) -> Lease:
        return self._pool.watch(lease_id, timeout_s)

    def suspend(self, lease_id: str, reason: str = "") -> Lease:
        return self._pool.suspend(lease_id, None, reason)

    def resume(self, lease_id: str) -> Lease:
        return self._pool.resume(lease_id)

    def report_parked(self, lease_id: str, host_bytes: int = 0, error: str = "") -> Lease:
        return self._pool.report_parked(lease_id, None, host_bytes, error)

    def report_restored(self, lease_id: str, error: str = "") -> Lease:
        return self._pool.report_restored(lease_id, None, error)

    def queues(self) -> List[QueueStatus]:
        return self._pool.queues()

    def set_queue(self, spec: QueueSpec) -> QueueStatus:
        return self._pool.set_queue(spec)

    def delete_queue(self, name: str) -> None:
        self._pool.delete_queue(name)

    def usage(
        self, since: float, until: Optional[float] = None, by: str = "queue", user: str = "", queue: str = ""
    ) -> List[UsageRow]:
        return self._pool.usage(since, until, by, user, queue)

    def history(self, since: float, until: Optional[float] = None) -> List[LeaseRecord]:
        return self._pool.history(since, until)

    def waiting(self, queue: Optional[str] = None, key: str = "") -> List[WaitingClaim]:
        return self._pool.waiting(queue, key)

    def hold_claim(self, claim_id: str) -> WaitingClaim:
        return self._pool.hold(claim_id)

    def release_claim(self, claim_id: str) -> WaitingClaim:
        return self._pool.unhold(claim_id)

    def cancel_claim(self, claim_id: str) -> WaitingClaim:
        return self._pool.cancel_claim(claim_id)

    def set_claim_priority(self, claim_id: str, priority: int) -> WaitingClaim:
        return self._pool.set_priority(claim_id, priority)

    def close(self) -> None:
        self._pool.close()
