"""Idle reclaim: a lease whose processes kept its GPUs 0 % busy for its idle limit is suspended.

The watchdog feeds every sample's attributed processes here. A lease is idle in a sample when
processes of it are on its GPUs and every one reports 0 % (NVML's per-process SM share, the
emulated usage file's `utilization`); a sample that shows none of its processes, or one whose
driver gives no share, says nothing and restarts the count. Its limit is its claim's
`idle_suspend_s`, else its queue's (`gpupool queue set --idle-suspend`), else the node's
(`--idle-suspend`). The suspension is the pool's (by: idle),
so the lease's runner parks it like any other and `gpupool resume` brings it back, and its idle clock starts again at the resume.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...core.errors import GpupoolError
from ...core.model import RUNNING
from ...core.suspension import BY_IDLE

if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence

    from ...core.model import Lease
    from ...core.usage import ProcessUsage
    from ...pooling.pool import Pool

log = logging.getLogger(__name__)


class IdleReclaim:
    """Counts each lease's idle time over the watchdog's samples and suspends the ones past their limit."""

    def __init__(self, pool: Pool, default_s: Optional[float] = None) -> None:
        self.pool = pool
        self.default_s = default_s
        self._idle_since: Dict[str, float] = {}  # lease id -> the first sample of its idle streak

    def observe(self, rows: Sequence[ProcessUsage], leases: Sequence[Lease], now: float) -> List[str]:
        """Take one sample into account; returns the ids of the leases suspended for it."""
        suspended: List[str] = []
        watched = set()
        by_queue = {spec.name: spec.idle_suspend_s for spec in self.pool.queue_specs()} if leases else {}
        for lease in leases:
            limit = _first(lease.idle_suspend_s, by_queue.get(lease.queue), self.default_s)
            if limit is None or lease.state != RUNNING or lease.preempted_at is not None:
                continue
            mine = [r for r in rows if r.lease_id == lease.id]
            if not mine or any(r.utilization is None or r.utilization > 0 for r in mine):
                continue
            watched.add(lease.id)
            # A resume (by hand or by the pool) restarts the clock: idle time counts from it, whatever
            # the samples before said, so a lease resumed by hand gets its whole limit again.
            resumed = lease.suspension.since if lease.suspension is not None else 0.0
            since = max(self._idle_since.setdefault(lease.id, now), resumed)
            self._idle_since[lease.id] = since
            if now - since >= limit and self._suspend(lease, limit):
                suspended.append(lease.id)
        for lease_id in list(self._idle_since):
            if lease_id not in watched or lease_id in suspended:
                del self._idle_since[lease_id]
        return suspended

    def _suspend(self, lease: Lease, limit: float) -> bool:
        try:
            self.pool.suspend(lease.id, None, f"idle: its GPUs 0 % busy for {limit:g} s", by=BY_IDLE)
        except GpupoolError as err:  # released or suspended meanwhile: the next sample sees it
            log.info("idle lease %s not suspended: %s", lease.id, err.message)
            return False
        log.warning("lease %s of %s suspended: idle for %g s", lease.id, lease.holder.describe(), limit)
        return True


def _first(*limits: Optional[float]) -> Optional[float]:
    """The first limit that is set."""
    return next((limit for limit in limits if limit is not None), None)
