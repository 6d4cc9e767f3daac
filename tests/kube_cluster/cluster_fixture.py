"""The `cluster` fixture: a real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok) with gpupool's webhook, extender and node agents as local processes, started
once per session by the code `make cluster-up` runs (tools/kube_cluster), and helpers that read
what the cluster did back from the API server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.kube_cluster import controlplane, gpupool_side  # noqa: E402

NODES, GPUS = 4, 8  # issue 35: 4 nodes x 8 GPUs
pytest.importorskip("kubernetes")


@dataclass
class Cluster:
    """The running cluster: its control plane, gpupool's side, an admin client and kubectl."""

    cp: controlplane.ControlPlane
    side: gpupool_side.GpupoolSide
    api: Any  # kubernetes.client.ApiClient, as the cluster's admin

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def kubectl(self, *args: str, stdin: Optional[str] = None, env: Optional[Dict[str, str]] = None) -> Any:
        """kubectl as the admin (v1.37, built with the control plane); the CompletedProcess."""
        return subprocess.run(
            [str(self.cp.kubectl), "--kubeconfig", str(self.cp.admin_kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    def json(self, model: Any) -> Dict[str, Any]:
        """A client model as the API's JSON (camelCase keys)."""
        return dict(self.api.sanitize_for_serialization(model))

    def namespace(self, prefix: str) -> str:
        """A new namespace (tests share the cluster: each works in its own)."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name}})
        return name

    def pod(self, namespace: str, name: str) -> Dict[str, Any]:
        return self.json(self.core.read_namespaced_pod(name, namespace))

    def pods(self, namespace: str, selector: str = "") -> List[Dict[str, Any]]:
        found = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return list(self.json(found).get("items") or [])

    def events(self, namespace: str, name: str) -> List[Dict[str, Any]]:
        found = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        return list(self.json(found).get("items") or [])

    def create_pod(self, namespace: str, pod: Dict[str, Any]) -> Dict[str, Any]:
        return self.json(self.core.create_namespaced_pod(namespace, pod))

    def webhook_calls(self, route: str) -> float:
        """How many calls of `route` (mutate, validate, filter, prioritize, bind) the webhook
        process has answered, from its /metrics."""
        import ssl
        import urllib.request

        context = ssl.create_default_context(cafile=str(self.side.tls / "ca.crt"))
        context.check_hostname = False
        with urllib.request.urlopen(self.side.webhook_url + "/metrics", timeout=10, context=context) as answer:
            text = answer.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("gpupool_webhook_requests_total{") and f'route="{route}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total


def gpu_pod(name: str, limits: Dict[str, str], annotations: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """A pod as a user writes it: one container asking for a GPU share in its limits."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "python:3.11",
                    "command": ["python", "train.py"],
                    "resources": {"limits": dict(limits)},
                }
            ],
        },
    }


def busybox_pod(name: str, script: str, **spec: Any) -> Dict[str, Any]:
    """A pod for a real node: the node's own image (nothing can be pulled here), running `script` with sh."""
    from tools.kube_cluster.kubelet_node import IMAGE

    container = {"name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", script]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container], **spec}}


def plain_pod(name: str) -> Dict[str, Any]:
    """A pod that asks for no GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "10m"}}}]},
    }


@contextlib.contextmanager
def running_cluster(nodes: int, gpus: int, real_nodes: int = 0) -> Iterator[Cluster]:
    """A cluster of `nodes` nodes (the last `real_nodes` with a real kubelet), DRA on; every process
    ends with it and its state folder goes (GPUPOOL_KEEP_CLUSTER_STATE keeps it)."""
    try:
        bin_dir = controlplane.build()
        if real_nodes:
            controlplane.build(["kubelet"])
    except controlplane.GoMissing as err:
        pytest.skip(f"no control plane here: {err}")
    from kubernetes import config

    # Short: the DRA plugin's Unix sockets live under it (108 bytes at most).
    state = Path(tempfile.mkdtemp(prefix="gpc-"))
    cp = controlplane.ControlPlane(state / "cp", bin_dir)
    side = None
    started = time.monotonic()
    try:
        side = gpupool_side.bring_up(cp, state / "cp", nodes=nodes, gpus=gpus, dra=True, real_nodes=real_nodes)
        print(f"cluster up in {time.monotonic() - started:.1f} s", file=sys.stderr)
        api = config.new_client_from_config(config_file=str(cp.admin_kubeconfig))
        yield Cluster(cp, side, api)
    finally:
        if side is not None:
            side.stop()
        cp.stop()
        if os.environ.get("GPUPOOL_KEEP_CLUSTER_STATE"):
            print(f"cluster state kept in {state}", file=sys.stderr)
        else:
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """Started once per session (a few tens of seconds on 2 cores); every process ends with it."""
    with running_cluster(NODES, GPUS) as started:
        yield started


def parse(text: str) -> Any:
    return json.loads(text)
