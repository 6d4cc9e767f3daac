"""The README's Kubernetes quick start on the local cluster (`make cluster-up`): a namespace's
token installed with `gpupool kube secret … | sh`, then `kubectl apply` of
deploy/examples/pod-half-gpu.yaml; the pod ends Running on a node, bound through the extender,
with its share in its annotations."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from waiting import wait_until

from .cluster_fixture import ROOT

pytestmark = pytest.mark.cluster


def test_the_readme_quick_start_runs_half_a_gpu(cluster, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(
        KUBECONFIG=str(cluster.cp.admin_kubeconfig),
        PATH=f"{cluster.cp.kubectl.parent}{os.pathsep}{env.get('PATH', '')}",  # the cluster's kubectl
        HOME=str(tmp_path),
    )
    if cluster.kubectl("get", "namespace", "team-a").returncode != 0:
        assert cluster.kubectl("create", "namespace", "team-a").returncode == 0
    secret = subprocess.run(
        f"{sys.executable} -m gpupool kube secret team-a --namespace team-a | sh -e",
        shell=True,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert secret.returncode == 0, secret.stderr
    token = cluster.json(cluster.core.read_namespaced_secret("gpupool-client", "team-a"))
    assert set(token["data"]) >= {"token"}
    applied = cluster.kubectl("apply", "-f", str(ROOT / "deploy/examples/pod-half-gpu.yaml"))
    assert applied.returncode == 0, applied.stderr
    pod = wait_until(
        lambda: p if (p := cluster.pod("team-a", "half-gpu"))["status"].get("phase") == "Running" else None,
        120,
        "the half-GPU pod to run",
    )
    annotations = pod["metadata"]["annotations"]
    choice = json.loads(annotations["gpupool.io/choice"])  # the extender's bind
    assert choice["node"] == pod["spec"]["nodeName"] and len(choice["gpus"]["train"]) == 1
    assert json.loads(annotations["gpupool.io/claim"])["train"]["percent"] == 50
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"gpupool.io/gpu": "50"}
