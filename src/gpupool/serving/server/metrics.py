"""Prometheus metrics of one app, in a registry of its own (tests build several apps).

Device, lease and queue gauges are read from the pool at scrape time, so
they also count what embedded clients on the same state dir did. Memory is
in bytes (Prometheus' base unit); the `_mib` gauges of 0.1 are kept one more
release as deprecated aliases (docs/guides/monitoring.md, "Metrics"). Every GPU series has the
NVML `uuid` label, which joins dcgm-exporter's `UUID`; lease and holder
series of a Kubernetes pod have `namespace` and `pod` labels, which join
kube-state-metrics. No `_created` series: they doubled the series count and
nothing reads them.
"""

from __future__ import annotations

import logging
import time
from typing import Dict, Iterator, Optional, Sequence, Tuple

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ... import __version__
from ...core.model import pod_of_label
from ...core.queues import QueuedClaim
from ...core.status import PoolStatus
from ...core.suspension import PREEMPT_MODES, RESUMING, SUSPENDED
from ...core.usage import Violation
from ...pooling.pool import Pool

log = logging.getLogger(__name__)

# Process-wide in prometheus_client: every registry of this process renders without `_created`.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client

CLAIM_RESULTS = ("granted", "unavailable", "unsatisfiable", "invalid", "denied", "error")
MIB_BYTES = 1024 * 1024
DEVICE_LABELS = ["uuid", "index", "name", "node"]
HOLDER_LABELS = ["holder", "namespace", "pod"]
LEASE_LABELS = ["lease", *HOLDER_LABELS]
# A resuming lease still holds its parked state in host memory until its runner restores it.
PARKED_STATES = (SUSPENDED, RESUMING)
# Suspend and resume move GPU memory through host memory at a few GiB/s: seconds to minutes.
STEP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class PoolCollector(Collector):
    """Gauges computed from one `Pool.status()` snapshot (and the queue) per scrape."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        try:
            status = self.pool.status()
            queue = self.pool.tickets.queue()
        except Exception:  # a scrape must not fail because the DB is busy
            log.warning("metrics: pool status failed", exc_info=True)
            return
        yield from _device_metrics(status)
        yield from _lease_metrics(status)
        yield from _suspension_metrics(status)
        yield from _queue_metrics(status, queue, time.time())
        yield from _team_queue_metrics(status)
        yield from _usage_metrics(status)
        info = GaugeMetricFamily("gpupool_build_info", "The gpupool version serving these metrics", labels=["version"])
        info.add_metric([__version__], 1)
        yield info


def _device_metrics(status: PoolStatus) -> Iterator[Metric]:
    total = GaugeMetricFamily("gpupool_device_memory_total_bytes", "Memory of each GPU", labels=DEVICE_LABELS)
    allocated = GaugeMetricFamily(
        "gpupool_device_memory_allocated_bytes", "Memory of each GPU held by leases", labels=DEVICE_LABELS
    )
    total_mib = GaugeMetricFamily(
        "gpupool_device_memory_total_mib",
        "Deprecated: use gpupool_device_memory_total_bytes (this alias goes in the next release)",
        labels=DEVICE_LABELS,
    )
    allocated_mib = GaugeMetricFamily(
        "gpupool_device_memory_allocated_mib",
        "Deprecated: use gpupool_device_memory_allocated_bytes (this alias goes in the next release)",
        labels=DEVICE_LABELS,
    )
    healthy = GaugeMetricFamily("gpupool_device_healthy", "1 when the GPU is healthy", labels=DEVICE_LABELS)
    used = status.allocated()
    for d in status.devices:
        values = [d.uuid, str(d.index), d.name, d.node]
        total.add_metric(values, d.memory_mib * MIB_BYTES)
        allocated.add_metric(values, used.get(d.uuid, 0) * MIB_BYTES)
        total_mib.add_metric(values, d.memory_mib)
        allocated_mib.add_metric(values, used.get(d.uuid, 0))
        healthy.add_metric(values, 1 if d.healthy else 0)
    yield from (total, allocated, healthy, total_mib, allocated_mib)


def _holder_values(name: str, label: str) -> Tuple[str, str, str]:
    namespace, pod = pod_of_label(label)
    return name, namespace, pod


def _lease_metrics(status: PoolStatus) -> Iterator[Metric]:
    """Per lease (and GPU) and per holder: on Kubernetes a holder is a pod, with its namespace."""
    yield GaugeMetricFamily("gpupool_leases", "Live leases", value=len(status.leases))
    yield GaugeMetricFamily(
        "gpupool_lease_problems",
        "Leases on GPUs that are gone, and GPUs whose leases hold more than their memory (gpupool status)",
        value=len(status.problems()),
    )
    by_slice = GaugeMetricFamily(
        "gpupool_lease_memory_allocated_bytes",
        "GPU memory each lease holds on each GPU",
        labels=[*LEASE_LABELS, "uuid", "node"],
    )
    started = GaugeMetricFamily(
        "gpupool_lease_start_timestamp_seconds", "When each lease was granted", labels=LEASE_LABELS
    )
    holder_leases = GaugeMetricFamily("gpupool_holder_leases", "Live leases of each holder", labels=HOLDER_LABELS)
    holder_bytes = GaugeMetricFamily(
        "gpupool_holder_memory_allocated_bytes", "GPU memory held by each holder's leases", labels=HOLDER_LABELS
    )
    nodes = {d.uuid: d.node for d in status.devices}
    per_holder: Dict[Tuple[str, str, str], Tuple[int, int]] = {}
    for lease in status.leases:
        holder = _holder_values(lease.holder.name, lease.holder.label)
        values = [lease.id, *holder]
        held = 0
        for s in lease.slices:
            by_slice.add_metric([*values, s.device_uuid, nodes.get(s.device_uuid, "")], s.memory_mib * MIB_BYTES)
            held += s.memory_mib
        started.add_metric(values, lease.created_at)
        count, mib = per_holder.get(holder, (0, 0))
        per_holder[holder] = (count + 1, mib + held)
    for holder, (count, mib) in per_holder.items():
        holder_leases.add_metric(list(holder), count)
        holder_bytes.add_metric(list(holder), mib * MIB_BYTES)
    yield from (by_slice, started, holder_leases, holder_bytes)


def _suspension_metrics(status: PoolStatus) -> Iterator[Metric]:
    """Suspended leases and the host memory they hold, per queue ('' = no queue), zeros included."""
    labels = ["queue"]
    suspended = GaugeMetricFamily(
        "gpupool_lease_suspended", "Leases suspended now (their GPU state parked in host memory)", labels=labels
    )
    host = GaugeMetricFamily(
        "gpupool_suspended_host_bytes", "Host memory holding the parked GPU state of suspended leases", labels=labels
    )
    # Every queue has a series from the start, so rate() and alerts see 0 rather than nothing.
    per_queue: Dict[str, Tuple[int, int]] = {q.spec.name: (0, 0) for q in status.queues}
    per_queue.setdefault("", (0, 0))
    for lease in status.leases:
        if lease.suspension is None or lease.state not in PARKED_STATES:
            continue
        count, held = per_queue.get(lease.queue, (0, 0))
        per_queue[lease.queue] = (count + 1, held + lease.suspension.host_bytes)
    for queue, (count, held) in sorted(per_queue.items()):
        suspended.add_metric([queue], count)
        host.add_metric([queue], held)
    yield from (suspended, host)


def _queue_metrics(status: PoolStatus, queue: Sequence[QueuedClaim], now: float) -> Iterator[Metric]:
    yield GaugeMetricFamily("gpupool_queue_length", "Claims waiting in the FIFO queue", value=status.queued)
    oldest: Optional[float] = min((q.queued_at for q in queue), default=None)
    yield GaugeMetricFamily(
        "gpupool_queue_oldest_wait_seconds",
        "How long the oldest claim in the queue has waited (0 when none waits)",
        value=0.0 if oldest is None else max(0.0, now - oldest),
    )


def _team_queue_metrics(status: PoolStatus) -> Iterator[Metric]:
    """Per team queue (gpupool queue set): quota, what it holds and borrows, claims waiting, preemptions."""
    labels = ["queue"]
    quota = GaugeMetricFamily("gpupool_queue_quota_gpus", "GPUs guaranteed to each queue", labels=labels)
    allocated = GaugeMetricFamily(
        "gpupool_queue_allocated_gpus", "GPUs (whole-GPU worth of shares) held by each queue's leases", labels=labels
    )
    borrowed = GaugeMetricFamily(
        "gpupool_queue_borrowed_gpus", "The part of each queue's allocation beyond its quota", labels=labels
    )
    waiting = GaugeMetricFamily("gpupool_queue_waiting_claims", "Claims of each queue waiting", labels=labels)
    preemptions = CounterMetricFamily(
        "gpupool_queue_preemptions",
        "Preemptions of each queue's leases to give another its quota, by the mode applied (suspend, requeue, kill)",
        labels=["queue", "mode"],
    )
    for q in status.queues:
        name = [q.spec.name]
        quota.add_metric(name, q.spec.quota)
        allocated.add_metric(name, q.allocated)
        borrowed.add_metric(name, q.borrowed)
        waiting.add_metric(name, q.waiting)
        for mode in PREEMPT_MODES:  # every mode, 0 included: a rate() sees a series from its start
            preemptions.add_metric([q.spec.name, mode], q.preempted.get(mode, 0))
    yield from (quota, allocated, borrowed, waiting, preemptions)


def _usage_metrics(status: PoolStatus) -> Iterator[Metric]:
    """The watchdog's usage record, in base units (bytes, ratios, seconds)."""
    usage = status.usage
    used = GaugeMetricFamily(
        "gpupool_device_memory_used_bytes",
        "GPU memory really used by all processes, as last sampled",
        labels=DEVICE_LABELS,
    )
    busy = GaugeMetricFamily(
        "gpupool_device_utilization_ratio",
        "Share of the last sample period the GPU was busy (0-1)",
        labels=DEVICE_LABELS,
    )
    lease_used = GaugeMetricFamily(
        "gpupool_lease_memory_used_bytes",
        "GPU memory really used by the processes of each lease",
        labels=LEASE_LABELS,
    )
    holder_used = GaugeMetricFamily(
        "gpupool_holder_memory_used_bytes",
        "GPU memory really used by the processes of each holder's leases",
        labels=HOLDER_LABELS,
    )
    actions = CounterMetricFamily(
        "gpupool_enforcement_actions",
        "Watchdog actions (kills, or warnings in warn mode) by reason",
        labels=["reason"],
    )
    if usage is not None:
        for d in status.devices:
            sample = usage.device(d.uuid)
            if sample is None:
                continue
            values = [d.uuid, str(d.index), d.name, d.node]
            used.add_metric(values, sample.memory_used_mib * MIB_BYTES)
            if sample.utilization is not None:
                busy.add_metric(values, sample.utilization)
        by_lease = usage.lease_memory_mib()
        by_holder: Dict[Tuple[str, str, str], int] = {}
        for lease in status.leases:
            holder = _holder_values(lease.holder.name, lease.holder.label)
            mib = by_lease.get(lease.id, 0)
            lease_used.add_metric([lease.id, *holder], mib * MIB_BYTES)
            by_holder[holder] = by_holder.get(holder, 0) + mib
        for holder, mib in by_holder.items():
            holder_used.add_metric(list(holder), mib * MIB_BYTES)
        for reason in Violation:
            actions.add_metric([reason.value], usage.actions_total.get(reason.value, 0))
        yield GaugeMetricFamily(
            "gpupool_usage_sampled_timestamp_seconds", "When the GPU usage was last sampled", value=usage.sampled_at
        )
        yield GaugeMetricFamily(
            "gpupool_unleased_processes",
            "Processes on pooled GPUs that belong to no lease",
            value=len(usage.unleased()),
        )
    else:
        for reason in Violation:
            actions.add_metric([reason.value], 0)
    yield from (used, busy, lease_used, holder_used, actions)


class Metrics:
    """The app's registry with its counters and histograms."""

    def __init__(self, pool: Pool) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(PoolCollector(pool))
        self.claims = Counter("gpupool_claims", "Claims by result", ["result"], registry=self.registry)
        for result in CLAIM_RESULTS:
            self.claims.labels(result)  # export zeros, so rate() works from the start
        self.claim_latency = Histogram(
            "gpupool_claim_latency_seconds",
            "Time to answer a claim, waiting included",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.releases = Counter(
            "gpupool_releases", "Leases released by their holder or an admin", registry=self.registry
        )
        self.expired = Counter("gpupool_leases_expired", "Leases reclaimed after their TTL", registry=self.registry)
        self.suspend_seconds = Histogram(
            "gpupool_suspend_seconds",
            "From a suspend's ask to its runner's report that the lease is parked",
            registry=self.registry,
            buckets=STEP_BUCKETS,
        )
        self.resume_seconds = Histogram(
            "gpupool_resume_seconds",
            "From a resume's room given to its runner's report that the lease runs again",
            registry=self.registry,
            buckets=STEP_BUCKETS,
        )

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
