"""The lease history and what is read from it: usage in GPU-seconds, queue status, preemption counts.

A lease's row is written (Tx.record_end) in the transaction that ends it (release,
expiry, reap), so the history is exactly as crash-safe as the leases themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.model import Device
from ..store.tx import Tx

if TYPE_CHECKING:
    from typing import List, Mapping, Sequence

    from ..core.queues import QueueStatus, UsageRow


def usage(
    tx: Tx,
    memory_of: Mapping[str, int],
    since: float,
    until: float,
    by: str,
    now: float,
    holder: str = "",
    queue: str = "",
) -> List[UsageRow]:
    """GPU-seconds per `by` key over [since, until]: ended leases from the history, live ones up to
    now; `holder`, `queue` (when given) keep only that holder's or queue's leases."""
    from ..core.queues import UsageSpan, usage_rows, used_gpus  # lazily, as in statuses

    spans = [UsageSpan(*row) for row in tx.history(since, until)]
    for lease in tx.leases("created_at <= ?", (until,)):
        # A live lease is used until now; one past its expiry that nobody reclaimed yet, until then.
        end = min(now, lease.expires_at)
        # Suspended time is not GPU time (issue 28): a suspended lease is counted by what it parked.
        suspended_s = 0.0 if lease.suspension is None else lease.suspension.suspended_seconds(end)
        gpus = used_gpus(lease, memory_of)
        spans.append(
            UsageSpan(lease.queue, lease.holder.name, lease.holder.label, gpus, lease.created_at, end, suspended_s)
        )
    if holder or queue:
        spans = [s for s in spans if (not holder or s.holder == holder) and (not queue or s.queue == queue)]
    return usage_rows(spans, since, until, by)


def statuses(tx: Tx, devices: Sequence[Device], now: float, default_mode: str = "") -> List[QueueStatus]:
    """Every queue with what it holds, borrows and waits for, and its preemptions ever by mode;
    `default_mode` is the pool's preemption mode, in force where a queue names none."""
    specs = tx.queue_specs()
    if not specs:
        return []
    # Only now: every run reads the pool's status, and a pool without queues never loads core.queues.
    from ..core.queues import queue_statuses

    return queue_statuses(
        specs,
        tx.leases("expires_at >= ?", (now,)),
        devices,
        tx.waiting_by_queue(now),
        tx.preemption_counts(),
        default_mode,
    )
