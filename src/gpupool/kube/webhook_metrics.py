"""Prometheus metrics of the webhook server: requests by route and result, and answer latency.

Served at GET /metrics by `admission.WebhookApp` (no auth, as the pool
server's); deploy/monitoring's Grafana dashboard and the GpupoolWebhookErrors
alert read them. The latency is the app's own time per request (parse,
decide, encode), which is what a slow webhook adds to every pod creation.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Tuple

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram

# Process-wide: no `_created` series (the pool server does the same).
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client

ROUTES = ("mutate", "validate", "filter", "prioritize", "bind")
RESULTS = ("ok", "error")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsText(NamedTuple):
    """The Prometheus text of GET /metrics: the web server sends `body` as is, with `content_type`."""

    content_type: str
    body: bytes


class WebhookMetrics:
    """The webhook's registry; `observe` once per routed request."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gpupool_webhook_requests",
            "Admission reviews and extender calls by route and result (error: answered 4xx or 5xx)",
            ["route", "result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpupool_webhook_latency_seconds",
            "Time to answer an admission review or extender call, by route",
            ["route"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )
        # children made once: zeros from the start (rate() works), and no label lookup per request
        self._counts: Dict[Tuple[str, str], Counter] = {
            (route, result): self.requests.labels(route, result) for route in ROUTES for result in RESULTS
        }
        self._latency: Dict[str, Histogram] = {route: self.latency.labels(route) for route in ROUTES}

    def observe(self, route: str, status: int, seconds: float) -> None:
        """Count one answer of `route` with HTTP `status`, which took `seconds`."""
        counter = self._counts.get((route, "ok" if status < 400 else "error"))
        if counter is None:
            return
        counter.inc()
        self._latency[route].observe(seconds)

    def text(self) -> MetricsText:
        """The answer of GET /metrics."""
        return MetricsText(CONTENT_TYPE, prometheus_client.generate_latest(self.registry))
