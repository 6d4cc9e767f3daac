"""A live /metrics against promtool and against what deploy/monitoring queries.

`promtool check metrics` lints the text of a real `gpupool server` (and of the
webhook); the Grafana dashboard and the alert rules may only query metrics one
of them exports. Needs promtool for the lint (skipped with the reason where missing).
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import time
from typing import Iterator, Set

import httpx
import pytest
import yaml
from waiting import wait_until

MONITORING = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
PROMTOOL = shutil.which("promtool")
METRIC = re.compile(r"\bgpupool_[a-z0-9_]+\b")
# Series Prometheus itself makes; the rules may use them.
PROMETHEUS_OWN = {"up"}


def exported(text: str) -> Set[str]:
    """Every series name a /metrics text can have: the families' TYPE lines with their suffixes."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind in ("histogram", "summary"):
                names.update({name + "_bucket", name + "_sum", name + "_count"})
    return names


def queries(obj) -> Iterator[str]:
    """Every PromQL text in a Grafana dashboard: panel targets and template variable queries."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, str) and (key in ("expr", "definition") or (key == "query" and "(" in value)):
                yield value
            else:
                yield from queries(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from queries(item)


@pytest.fixture(scope="module")
def live_metrics(tmp_path_factory) -> str:
    """/metrics of a real server holding a pod's lease and a user's lease, and the webhook's."""
    from conftest import start_server

    server = start_server(tmp_path_factory.mktemp("metrics") / "state")
    try:
        h = server.headers()
        assert httpx.put(server.url + "/v1/queues/team-a", json={"quota": 1}, headers=h).status_code == 200
        for label, queue in (("pod:team-a/train-0:0d5c0d5c-uid", "team-a"), ("", "")):
            claim = {"requests": [{"count": 1, "fraction": 0.25}], "queue": queue}
            body = {"claim": claim, "holder": {"pid": 1, "label": label}}
            assert httpx.post(server.url + "/v1/leases", json=body, headers=h).status_code == 201
        claimed = time.time()

        def sampled_since_the_claims() -> str:
            text = httpx.get(server.url + "/metrics").text
            found = re.search(r"^gpupool_usage_sampled_timestamp_seconds (\S+)$", text, re.M)
            return text if found and float(found.group(1)) > claimed else ""

        text = wait_until(sampled_since_the_claims, 10, "a watchdog sample after the claims")
    finally:
        server.stop()
    return text + webhook_metrics()


def webhook_metrics() -> str:
    from gpupool.kube.admission import WebhookApp
    from gpupool.kube.mutate import MutateConfig
    from gpupool.kube.nodestate import ClusterState

    app = WebhookApp(MutateConfig(), ClusterState(dict))
    app.handle("POST", "/mutate", b"{}")
    status, body = app.handle("GET", "/metrics", b"")
    assert status == 200
    return body.body.decode() if hasattr(body, "body") else str(body)


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool: apt-get install prometheus")
def test_promtool_check_metrics_on_a_live_server(live_metrics):
    done = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=live_metrics, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


def test_base_units_labels_and_no_created_series(live_metrics):
    text = live_metrics
    names = exported(text)
    assert {"gpupool_device_memory_total_bytes", "gpupool_device_memory_allocated_bytes"} <= names
    assert not [n for n in names if n.endswith("_created")] and "_created{" not in text and "_created " not in text
    # 0.25 of 16 GiB, twice: on one GPU (binpack), in bytes
    assert re.search(r'gpupool_device_memory_allocated_bytes\{[^}]*uuid="GPU-emu-[^"]+"[^}]*\} 8\.589934592e\+09', text)
    pod = re.search(r"gpupool_lease_memory_allocated_bytes\{([^}]*)\} 4\.294967296e\+09", text)
    assert pod, text
    lines = [line for line in text.splitlines() if line.startswith("gpupool_lease_memory_allocated_bytes{")]
    assert any('namespace="team-a"' in line and 'pod="train-0"' in line for line in lines)
    assert any('namespace=""' in line and 'pod=""' in line for line in lines)
    assert any('namespace="team-a"' in line for line in text.splitlines() if line.startswith("gpupool_holder_"))
    # the old names, one more release, marked as such
    for old in ("gpupool_device_memory_total_mib", "gpupool_device_memory_allocated_mib"):
        assert old in names and re.search(rf"# HELP {old} Deprecated", text)


def test_per_queue_series(live_metrics):
    for name in ("quota_gpus", "allocated_gpus", "borrowed_gpus", "waiting_claims"):
        assert f'gpupool_queue_{name}{{queue="team-a"}}' in live_metrics, name
    assert 'gpupool_queue_allocated_gpus{queue="team-a"} 0.25' in live_metrics
    assert "# TYPE gpupool_queue_preemptions_total counter" in live_metrics
    for mode in ("suspend", "requeue", "kill"):  # each mode's series, from 0
        assert f'gpupool_queue_preemptions_total{{mode="{mode}",queue="team-a"}} 0.0' in live_metrics
    # suspension (issue 28): zeros per queue before any lease is suspended, histograms for promtool
    assert 'gpupool_lease_suspended{queue="team-a"} 0.0' in live_metrics
    assert 'gpupool_suspended_host_bytes{queue=""} 0.0' in live_metrics
    for step in ("suspend", "resume"):
        assert f"# TYPE gpupool_{step}_seconds histogram" in live_metrics


def test_grafana_dashboard_queries_only_exported_metrics(live_metrics):
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    used = {m for q in queries(dashboard) for m in METRIC.findall(q)}
    assert len(used) >= 15
    missing = used - exported(live_metrics)
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "gpupool"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]


def test_alert_rules_query_only_exported_metrics(live_metrics):
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    used = {m for g in rules["groups"] for r in g["rules"] for m in METRIC.findall(r["expr"])}
    missing = used - exported(live_metrics) - PROMETHEUS_OWN
    assert not missing, f"the alerts query metrics nobody exports: {sorted(missing)}"
