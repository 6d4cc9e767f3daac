"""Jobs for real: `gpupool submit --target kubernetes` creates the Indexed Job and its headless
Service in the API server; the Job controller makes the pods, gpupool's webhook gives them their
share and the extender binds them, kwok runs them to the end; `gpupool jobs` follows the phase from
the cluster's own objects, and a failing pod is retried as far as the spec's backoffLimit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from envs import clean_env
from gpupool_cli import gpupool
from waiting import wait_until

pytestmark = pytest.mark.cluster

FAIL_ANNOTATION = "gpupool.test/fail"  # kwok's stage fails a pod that carries it (tools/kube_cluster/kwok_stages.py)


def admin_env(cluster: Any, home: Path) -> Dict[str, str]:
    """The env of a gpupool user with the cluster's admin kubeconfig."""
    return clean_env(
        drop="KUBERNETES_",
        KUBECONFIG=str(cluster.cp.admin_kubeconfig),
        HOME=str(home),
        GPUPOOL_CONFIG=str(home / "none.yaml"),
    )


def job_spec(name: str, **extra: Any) -> Dict[str, Any]:
    spec: Dict[str, Any] = {
        "name": name,
        "framework": "pytorch",
        "restartPolicy": "Never",
        "image": "ghcr.io/gpupool/gpupool-examples:0.1.0-pytorch",
        "roles": {"worker": {"replicas": 2, "gpu": {"count": 1, "fraction": 0.5}, "command": ["python", "train.py"]}},
    }
    spec.update(extra)
    return spec


def describe(cluster: Any, ns: str, name: str, home: Path) -> Dict[str, Any]:
    done = gpupool(
        "jobs",
        name,
        "--target",
        "kubernetes",
        "--namespace",
        ns,
        "--json",
        env=admin_env(cluster, home),
        cwd=home,
    )
    assert done.returncode == 0, done.stderr
    found: List[Dict[str, Any]] = json.loads(done.stdout)
    return found[0]


def submit(cluster: Any, ns: str, spec: Dict[str, Any], home: Path) -> None:
    path = home / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = gpupool(
        "submit",
        str(path),
        "--target",
        "kubernetes",
        "--namespace",
        ns,
        env=admin_env(cluster, home),
        cwd=home,
    )
    assert done.returncode == 0, done.stderr


def test_a_submitted_job_runs_on_the_cluster_to_succeeded(cluster, tmp_path):
    ns = cluster.namespace("jobs")
    submit(cluster, ns, job_spec("ddp"), tmp_path)
    # What the cluster holds: an Indexed Job of 2 completions and its headless Service.
    from kubernetes import client

    job = cluster.json(client.BatchV1Api(cluster.api).read_namespaced_job("ddp-worker", ns))
    assert (job["spec"]["completionMode"], job["spec"]["completions"]) == ("Indexed", 2)
    service = cluster.json(cluster.core.read_namespaced_service("ddp", ns))
    assert service["spec"]["clusterIP"] == "None"
    # The Job controller's pods, each given half a GPU by the webhook and bound by the extender.
    pods = wait_until(lambda: p if len(p := cluster.pods(ns)) == 2 else None, 120, "the Job's 2 pods")
    for pod in pods:
        wait_until(
            lambda pod=pod: (
                "gpupool.io/choice" in (cluster.pod(ns, pod["metadata"]["name"])["metadata"]["annotations"])
            ),
            120,
            "the extender's bind of each pod",
        )
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["gpupool.io/gpu"] == "50"
    described = wait_until(
        lambda: (d := describe(cluster, ns, "ddp", tmp_path))["status"] == "Succeeded" and d,
        180,
        "gpupool jobs to show the job Succeeded",
        interval=1,
    )
    assert [r["status"] for r in described["replicas"]] == ["Succeeded", "Succeeded"]
    assert described["restarts"] == 0


def test_a_failing_pod_is_retried_as_far_as_the_backoff_limit(cluster, tmp_path):
    ns = cluster.namespace("jobs")
    spec = job_spec("flaky", restartPolicy="OnFailure", backoffLimit=1, annotations={FAIL_ANNOTATION: "true"})
    spec["roles"]["worker"]["replicas"] = 1  # its one failure leaves the backoff limit one retry
    submit(cluster, ns, spec, tmp_path)
    described = wait_until(
        lambda: (d := describe(cluster, ns, "flaky", tmp_path))["status"] == "Failed" and d,
        240,
        "gpupool jobs to show the job Failed",
        interval=1,
    )
    # backoffLimit 1: the Job controller tried again once after the first failure, then gave up.
    assert described["restarts"] == 1
    from kubernetes import client

    job = cluster.json(client.BatchV1Api(cluster.api).read_namespaced_job("flaky-worker", ns))
    assert job["spec"]["backoffLimit"] == 1
    conditions = {c["type"]: c for c in job["status"].get("conditions") or []}
    assert conditions["Failed"]["reason"] == "BackoffLimitExceeded"
    assert job["status"]["failed"] == 2
