"""A real Prometheus scrapes a real `gpupool server`: every Grafana query and alert rule evaluates.

promtool checks syntax; this runs each PromQL text of grafana-dashboard.json against
live data (template variables filled in) and loads alerts.yaml, whose rules must all
evaluate without error. Needs Debian's `prometheus` package; skipped with the reason
where the server binary is missing.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
from typing import Any, Dict, List

import httpx
import pytest
from conftest import stop_process
from envs import free_port
from waiting import tail, wait_until

from gpupool.kube.admission import WebhookApp
from gpupool.kube.admission import serve as serve_webhook
from gpupool.kube.mutate import MutateConfig
from gpupool.kube.nodestate import ClusterState

MONITORING = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs Prometheus: apt-get install prometheus")
# Grafana's variables, as Grafana substitutes them for "All" and a short range
VARIABLES = {"$__rate_interval": "1m", "$node": ".*", "$namespace": ".*"}


def queries(obj: Any):
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from queries(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from queries(item)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Prometheus scraping a server that holds a pod's lease, with deploy/monitoring's rules loaded."""
    from conftest import start_server

    base = tmp_path_factory.mktemp("prometheus")
    server = start_server(base / "state")
    body = {"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "holder": {"label": "pod:team-a/train-0:uid"}}
    assert httpx.post(server.url + "/v1/leases", json=body, headers=server.headers()).status_code == 201
    webhook = serve_webhook("127.0.0.1:0", WebhookApp(MutateConfig(), ClusterState(dict)))  # plain HTTP here
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": []},
    }
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u1", "object": pod}}
    hook = f"127.0.0.1:{webhook.server_address[1]}"
    assert httpx.post(f"http://{hook}/mutate", json=review).status_code == 200
    shutil.copy(MONITORING / "alerts.yaml", base / "alerts.yaml")
    target = server.url.split("://", 1)[1]
    (base / "prometheus.yml").write_text(
        "global: {scrape_interval: 500ms, evaluation_interval: 500ms}\n"
        "rule_files: [alerts.yaml]\n"
        "scrape_configs:\n"
        f"  - {{job_name: gpupool, static_configs: [{{targets: ['{target}']}}]}}\n"
        f"  - {{job_name: gpupool-webhook, static_configs: [{{targets: ['{hook}']}}]}}\n"
    )
    port = free_port()
    with open(base / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={base / 'prometheus.yml'}",
                f"--storage.tsdb.path={base / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def scraped_twice() -> bool:  # so that rate() has two samples
        try:
            up = query(url, 'count_over_time(up{job="gpupool"}[1m])')
        except (httpx.HTTPError, ValueError):  # not listening yet, or its plain 503 while it starts
            return False
        return bool(up) and float(up[0]["value"][1]) >= 2

    try:
        wait_until(
            scraped_twice, 120, "two scrapes of gpupool", interval=0.2, detail=lambda: tail(base / "prometheus.log")
        )
        yield url
    finally:
        stop_process(proc)
        server.stop()
        webhook.shutdown()


def query(url: str, promql: str) -> list:
    answer: Dict[str, Any] = httpx.get(url + "/api/v1/query", params={"query": promql}, timeout=10).json()
    assert answer["status"] == "success", (promql, answer)
    result: list = answer["data"]["result"]
    return result


def test_every_grafana_query_evaluates_on_live_data(prometheus):
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    empty = []
    for expr in queries(dashboard):
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        if not query(prometheus, expr):
            empty.append(expr)
    # Only the GPU utilisation (emulated GPUs have none) and the count of unhealthy GPUs may be empty.
    allowed = ("utilization", "== 0")
    assert not [e for e in empty if not any(a in e for a in allowed)], empty
    print(f"{len(empty)} queries without data here: {empty}")


def test_the_pod_lease_joins_on_namespace_and_pod(prometheus):
    (series,) = query(prometheus, 'gpupool_lease_memory_allocated_bytes{namespace="team-a"}')
    assert series["metric"]["pod"] == "train-0" and float(series["value"][1]) == 8 * 1024**3


def test_every_alert_rule_evaluates(prometheus):
    def evaluated() -> List[Dict[str, Any]]:
        groups = httpx.get(prometheus + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else []

    rules = wait_until(evaluated, 120, "every rule evaluated once", interval=0.3)
    assert len(rules) == 7
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
