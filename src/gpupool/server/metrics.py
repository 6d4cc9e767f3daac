"""Prometheus metrics of one app, in a registry of its own (tests build several apps).

Device, lease and queue gauges are read from the pool at scrape time, so
they also count what embedded clients on the same state dir did.
"""

from __future__ import annotations

import logging
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.model import PoolStatus
from ..core.usage import Violation
from ..pool import Pool

log = logging.getLogger(__name__)

CLAIM_RESULTS = ("granted", "unavailable", "unsatisfiable", "invalid", "denied", "error")


class PoolCollector(Collector):
    """Gauges computed from one `Pool.status()` snapshot per scrape."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        try:
            status = self.pool.status()
        except Exception:  # a scrape must not fail because the DB is busy
            log.warning("metrics: pool status failed", exc_info=True)
            return
        labels = ["uuid", "index", "name", "node"]
        total = GaugeMetricFamily("gpupool_device_memory_total_mib", "Memory of each GPU in MiB", labels=labels)
        allocated = GaugeMetricFamily(
            "gpupool_device_memory_allocated_mib", "Memory of each GPU held by leases in MiB", labels=labels
        )
        healthy = GaugeMetricFamily("gpupool_device_healthy", "1 when the GPU is healthy", labels=labels)
        used = status.allocated()
        for d in status.devices:
            values = [d.uuid, str(d.index), d.name, d.node]
            total.add_metric(values, d.memory_mib)
            allocated.add_metric(values, used.get(d.uuid, 0))
            healthy.add_metric(values, 1 if d.healthy else 0)
        yield total
        yield allocated
        yield healthy
        yield GaugeMetricFamily("gpupool_leases", "Live leases", value=len(status.leases))
        yield GaugeMetricFamily("gpupool_queue_length", "Claims waiting in the FIFO queue", value=status.queued)
        yield GaugeMetricFamily(
            "gpupool_lease_problems",
            "Leases on GPUs that are gone, and GPUs whose leases hold more than their memory (gpupool status)",
            value=len(status.problems()),
        )
        yield from _usage_metrics(status)


MIB_BYTES = 1024 * 1024


def _usage_metrics(status: PoolStatus) -> Iterator[Metric]:
    """The watchdog's usage record, in base units (bytes, ratios, seconds)."""
    usage = status.usage
    labels = ["uuid", "index", "name", "node"]
    used = GaugeMetricFamily(
        "gpupool_device_memory_used_bytes", "GPU memory really used by all processes, as last sampled", labels=labels
    )
    busy = GaugeMetricFamily(
        "gpupool_device_utilization_ratio", "Share of the last sample period the GPU was busy (0-1)", labels=labels
    )
    lease_used = GaugeMetricFamily(
        "gpupool_lease_memory_used_bytes",
        "GPU memory really used by the processes of each lease",
        labels=["lease", "holder"],
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
        for lease in status.leases:
            lease_used.add_metric([lease.id, lease.holder.name], by_lease.get(lease.id, 0) * MIB_BYTES)
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
    yield used
    yield busy
    yield lease_used
    yield actions


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

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
