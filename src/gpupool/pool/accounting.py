"""The lease history and what is read from it: usage in GPU-seconds, queue status, preemption counts.

A lease's row is written in the transaction that ends it (release, expiry, reap),
so the history is exactly as crash-safe as the leases themselves.
"""

from __future__ import annotations

import json
from typing import List, Mapping, Optional, Sequence

from ..core.model import Device, Lease, Slice
from ..core.queues import QueueStatus, UsageRow, UsageSpan, lease_gpus, queue_statuses, slices_gpus, usage_rows
from ..store.tx import TakenLease, Tx


def record_taken(
    tx: Tx, lease_id: str, taken: TakenLease, slices: Sequence[Slice], memory_of: Mapping[str, int], now: float
) -> None:
    """History row of a lease its holder released (`taken`: what Tx.take_lease returned of it)."""
    holder_name, holder_json, queue, created_at, preempted_at = taken
    label = str(json.loads(holder_json).get("label", "") or "")
    gpus = slices_gpus(slices, memory_of)
    tx.add_history(lease_id, queue, holder_name, label, gpus, created_at, now, "released", preempted_at)


def record_ended(tx: Tx, lease: Lease, memory_of: Mapping[str, int], ended_at: float) -> None:
    """History row of a lease the pool reclaimed: reaped after a preemption, or expired."""
    reason = "preempted" if lease.preempted_at is not None else "expired"
    tx.add_history(
        lease.id,
        lease.queue,
        lease.holder.name,
        lease.holder.label,
        lease_gpus(lease, memory_of),
        lease.created_at,
        ended_at,
        reason,
        lease.preempted_at,
    )


def usage(tx: Tx, memory_of: Mapping[str, int], since: float, until: float, by: str, now: float) -> List[UsageRow]:
    """GPU-seconds per `by` key over [since, until]: ended leases from the history, live ones up to now."""
    spans = [
        UsageSpan(queue, holder, label, gpus, start, end)
        for queue, holder, label, gpus, start, end in tx.history(since, until)
    ]
    for lease in tx.leases("created_at <= ?", (until,)):
        # A live lease is used until now; one past its expiry that nobody reclaimed yet, until then.
        end: Optional[float] = min(now, lease.expires_at)
        spans.append(
            UsageSpan(
                lease.queue, lease.holder.name, lease.holder.label, lease_gpus(lease, memory_of), lease.created_at, end
            )
        )
    return usage_rows(spans, since, until, by)


def statuses(tx: Tx, devices: Sequence[Device], now: float) -> List[QueueStatus]:
    """Every queue with what it holds, borrows and waits for, and its preemptions ever."""
    specs = tx.queue_specs()
    if not specs:
        return []
    return queue_statuses(
        specs,
        tx.leases("expires_at >= ?", (now,)),
        devices,
        tx.waiting_by_queue(now),
        tx.preemption_counts(),
    )
