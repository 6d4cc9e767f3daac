"""The runner's side of suspend and resume: park the command's tree and bring it back.

Suspend: the backend (isolation/parking.py) locks and parks every process of the tree that
holds GPU state, then the rest of the tree is stopped (SIGSTOP: the command sees no signal it
could handle), and the pool hears that the lease's memory is free. Resume: the backend restores
the parked processes (onto the GPUs the pool gave, remapped where they moved) and unlocks them,
the rest of the tree continues, and the pool hears it. Each step is idempotent: after a report
that did not reach the pool, the watch sees the same state again and only the report is repeated.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from ...core.errors import GpupoolError
from ...core.model import Lease
from ...logs import get_logger
from ...pooling.isolation.proctree import send_signal
from .tree import tree_pids

if TYPE_CHECKING:
    from typing import Callable, List, Optional, Set

    from ...pooling.isolation.parking import Backend, Parked
    from ..client.base import PoolClient

log = get_logger(__name__)

# How long the driver's lock waits for the process's CUDA work in flight to finish.
LOCK_TIMEOUT_S = 10.0


class Suspender:
    """Parks and restores the tree of one command for lease `lease_id` of `client`."""

    def __init__(
        self,
        client: PoolClient,
        lease_id: str,
        child_pgid: int,
        keep: Set[int],
        backend_name: str,
        say: Callable[[str], None],
        usage_file: str = "",
        emulated: bool = False,
    ) -> None:
        self.client = client
        self.lease_id = lease_id
        self.child_pgid = child_pgid
        self.keep = keep  # the runner's own helpers (the guard): never stopped
        self.backend_name = backend_name
        self.usage_file = usage_file  # the pool's emulated usage file, where no env names one
        self.emulated = emulated  # the lease's GPUs are emulated: "auto" is the emulated backend
        self.say = say
        self._backend: Optional[Backend] = None
        self.parked: Optional[Parked] = None
        self.stopped: List[int] = []

    def backend(self) -> Backend:
        """The backend, made at first use (cuda-bindings is imported only when a lease suspends)."""
        if self._backend is None:
            from ...pooling.isolation.parking import backend_named

            self._backend = backend_named(self.backend_name, self.usage_file, self.emulated)
        return self._backend

    def park(self, lease: Lease) -> None:
        """Suspend the tree and tell the pool; on failure tell it why, and leave the tree running."""
        if self.parked is None:
            try:
                self._park(lease)
            except GpupoolError as err:
                self.say(f"warning: lease {lease.id} could not be suspended: {err.message}")
                self.client.report_parked(lease.id, error=err.message)
                return
        assert self.parked is not None
        self.client.report_parked(lease.id, host_bytes=self.parked.host_bytes)

    def _park(self, lease: Lease) -> None:
        backend = self.backend()
        if backend.name == "cuda":
            from ...pooling.isolation.parking import cuda_unavailable_reason

            reason = cuda_unavailable_reason()
            if reason is not None:
                raise GpupoolError(f"the cuda suspend backend cannot work here: {reason}")
        pids = tree_pids(self.child_pgid, self.keep, lease.id)
        gpu = backend.gpu_pids(pids)
        parked = backend.suspend(gpu, LOCK_TIMEOUT_S)
        held = set(parked.pids)
        self.stopped = [pid for pid in pids if pid not in held and send_signal(pid, signal.SIGSTOP)]
        self.parked = parked
        why = lease.suspension.reason if lease.suspension is not None else "asked"
        self.say(
            f"lease {lease.id} suspended ({why}): {len(parked.pids)} GPU process(es) parked, "
            f"{parked.host_bytes / 2**30:.2f} GiB in host memory, {len(self.stopped)} other process(es) stopped"
        )

    def restore(self, lease: Lease) -> None:
        """Bring the tree back and tell the pool; on failure it stays parked and the pool hears why."""
        if self.parked is not None:
            remap = dict(lease.suspension.remap) if lease.suspension is not None else {}
            try:
                self.backend().resume(self.parked, remap)
            except GpupoolError as err:
                self.say(f"warning: lease {lease.id} could not be resumed, it stays suspended: {err.message}")
                self.client.report_restored(lease.id, error=err.message)
                return
            for pid in self.stopped:
                send_signal(pid, signal.SIGCONT)
            moved = f" (moved: {', '.join(f'{a} -> {b}' for a, b in remap.items())})" if remap else ""
            self.say(f"lease {lease.id} resumed{moved}")
            self.parked, self.stopped = None, []
        self.client.report_restored(lease.id)
