"""The lease history and what is read from it: usage in GPU-seconds, queue status, preemption counts.

A lease's row is written (Tx.record_end) in the transaction that ends it (release,
expiry, reap), so the history is exactly as crash-safe as the leases themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.errors import InvalidInput, NotFound
from ...core.model import Device
from ...logs import get_logger
from ..store.tx import Tx
from .ledger import check_time

log = get_logger(__name__)

if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Sequence

    from ...core.queues import LeaseRecord, QueueSpec, QueueStatus, UsageRow
    from .ledger import Ledger


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
    from ...core.queues import UsageSpan, usage_rows, used_gpus  # lazily, as in statuses

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
    from ...core.queues import queue_statuses

    return queue_statuses(
        specs,
        tx.leases("expires_at >= ?", (now,)),
        devices,
        tx.waiting_by_queue(now),
        tx.preemption_counts(),
        default_mode,
    )


class Accounts:
    """The verbs of queues and accounting: the queues' status and definitions, usage, history."""

    def __init__(self, ledger: Ledger, preempt_mode: str) -> None:
        self.ledger = ledger
        self.preempt_mode = preempt_mode  # the pool's, in force where a queue names none

    def queues(self) -> List[QueueStatus]:
        """Every queue with what it holds, borrows and waits for."""
        now = self.ledger.clock()
        with self.ledger.store.read() as tx:
            return statuses(tx, self.ledger.devices(tx), now, self.preempt_mode)

    def queue_specs(self) -> List[QueueSpec]:
        """The queues' definitions alone (no load read): what the watchdog's idle reclaim needs."""
        with self.ledger.store.read() as tx:
            return tx.queue_specs()

    def set_queue(self, spec: QueueSpec) -> QueueStatus:
        """Create or update a queue; InvalidInput when the quotas would sum above the pool's GPUs."""
        from ...core.queues import QueueSpec, check_quotas_fit  # lazily: a pool without queues never loads core.queues

        if not isinstance(spec, QueueSpec):
            raise InvalidInput(f"a queue must be a QueueSpec, got {type(spec).__name__}")
        with self.ledger.write() as (tx, view):
            view.invalidate()  # its queue definitions changed
            others = [s for s in tx.queue_specs() if s.name != spec.name]
            check_quotas_fit(others + [spec], float(len(self.ledger.devices(tx))))
            tx.put_queue(spec)
        log.info("queue %s set: quota %g, weight %g, limit %s", spec.name, spec.quota, spec.weight, spec.limit)
        return next(q for q in self.queues() if q.spec.name == spec.name)

    def delete_queue(self, name: str) -> None:
        """Delete a queue; NotFound when there is none, InvalidInput while it has leases or waiting claims."""
        with self.ledger.write() as (tx, view):
            view.invalidate()
            known = {s.name for s in tx.queue_specs()}
            if name not in known:
                raise NotFound(
                    f"queue {name!r} does not exist (queues: {', '.join(sorted(known)) or 'none'}): "
                    "`gpupool queue list` shows them"
                )
            leases, tickets = tx.queue_busy(name)
            if leases or tickets:
                raise InvalidInput(
                    f"queue {name!r} still has {leases} lease(s) and {tickets} waiting claim(s): "
                    "delete it once they have ended"
                )
            tx.delete_queue(name)
        log.info("queue %s deleted", name)

    def usage(
        self, since: float, until: Optional[float] = None, by: str = "queue", holder: str = "", queue: str = ""
    ) -> List[UsageRow]:
        """GPU-seconds per queue, holder or label (`by`) over [since, until or now], most used first;
        `holder`, `queue` keep only that holder's or queue's leases (`gpupool usage --user/--queue`)."""
        from ...core.queues import check_usage_key  # lazily: a pool without queues never loads core.queues

        check_usage_key(by)
        now = self.ledger.clock()
        since = check_time(since, "since")
        end = now if until is None else check_time(until, "until")
        if end < since:
            raise InvalidInput(f"until {end!r} is before since {since!r}: give a window that ends after it starts")
        with self.ledger.store.read() as tx:
            memory_of = {d.uuid: d.memory_mib for d in self.ledger.devices(tx)}
            return usage(tx, memory_of, since, end, by, now, holder, queue)

    def history(self, since: float, until: Optional[float] = None) -> List[LeaseRecord]:
        """Each lease that ended in [since, until or now], in the order they ended."""
        from ...core.queues import LeaseRecord  # lazily: a pool that is only claimed from never lists it

        since = check_time(since, "since")
        end = self.ledger.clock() if until is None else check_time(until, "until")
        with self.ledger.store.read() as tx:
            return [LeaseRecord(*row) for row in tx.lease_records(since, end)]
