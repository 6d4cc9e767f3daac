"""The webhook's /metrics: requests by route and result, latency, over the real HTTPS server."""

from __future__ import annotations

import http.client
import json
import ssl

from gpupool.kube.admission import WebhookApp
from gpupool.kube.mutate import MutateConfig
from gpupool.kube.nodestate import ClusterState

from .conftest import review


def get(webhook, path: str):
    ctx = ssl.create_default_context(cafile=webhook["ca"])
    conn = http.client.HTTPSConnection("localhost", webhook["port"], context=ctx, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type"), resp.read().decode()
    finally:
        conn.close()


def sample(text: str, series: str) -> float:
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " "))


def test_counts_answers_by_route_and_result():
    app = WebhookApp(MutateConfig(), ClusterState(dict))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": []},
    }
    assert app.handle("POST", "/mutate", json.dumps(review(pod)).encode())[0] == 200
    assert app.handle("POST", "/mutate", b"not json")[0] == 400
    assert app.handle("POST", "/extender/filter", b"[]")[0] == 400
    status, answer = app.handle("GET", "/metrics", b"")
    assert status == 200
    text = answer.body.decode()
    assert sample(text, 'gpupool_webhook_requests_total{result="ok",route="mutate"}') == 1
    assert sample(text, 'gpupool_webhook_requests_total{result="error",route="mutate"}') == 1
    assert sample(text, 'gpupool_webhook_requests_total{result="error",route="filter"}') == 1
    assert sample(text, 'gpupool_webhook_requests_total{result="ok",route="validate"}') == 0
    assert sample(text, 'gpupool_webhook_latency_seconds_count{route="mutate"}') == 2
    assert "_created" not in text


def test_metrics_over_https(webhook, client):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": []},
    }
    assert client.post("/validate", review(pod))[0] == 200
    status, content_type, text = get(webhook, "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    assert sample(text, 'gpupool_webhook_requests_total{result="ok",route="validate"}') >= 1
    # healthz and metrics themselves are not counted as admission traffic
    assert 'route="healthz"' not in text
