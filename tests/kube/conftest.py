"""Shared fixtures: TLS material, a running webhook server, a JSONPatch applier, a kubelet stand-in."""

from __future__ import annotations

import copy
import http.client
import json
import os
import queue
import re
import ssl
import subprocess
import sys
import uuid
from concurrent import futures
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import grpc
import pytest
from waiting import tail, wait_until

from gpupool.core.model import Device
from gpupool.kube.admission import WebhookApp, serve
from gpupool.kube.certs import write_certs
from gpupool.kube.deviceplugin import api_pb2 as pb
from gpupool.kube.deviceplugin import api_pb2_grpc as rpc
from gpupool.kube.extender import NodeState
from gpupool.kube.mutate import MutateConfig
from gpupool.kube.nodestate import ClusterState


def start_webhook_process(tls: Dict[str, str], log: Path) -> Tuple[subprocess.Popen, int]:
    """A real `gpupool kube webhook` over TLS on a free port: (process, port) once it listens."""
    args = [sys.executable, "-m", "gpupool", "kube", "webhook", "--listen", "127.0.0.1:0"]
    args += ["--tls-cert", tls["crt"], "--tls-key", tls["key"], "--agents", "node-a=http://127.0.0.1:9"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def listening() -> Optional[re.Match]:
        if proc.poll() is not None:
            raise RuntimeError(f"the webhook exited ({proc.returncode}):\n{log.read_text()}")
        return re.search(rb"listening on https://\S+:(\d+)", log.read_bytes())

    try:
        match = wait_until(listening, 60, "the webhook to listen", detail=lambda: tail(log))
    except AssertionError:
        proc.kill()
        raise
    return proc, int(match.group(1))


def gpus(node: str, count: int, mib: int = 16384) -> tuple:
    return tuple(Device(f"GPU-{node}-{i}", i, "Test GPU", mib, node) for i in range(count))


@pytest.fixture(scope="session")
def tls(tmp_path_factory):
    out = tmp_path_factory.mktemp("tls")
    ca, crt, key = write_certs(str(out), ["localhost"], ip_addresses=["127.0.0.1"])
    return {"ca": str(ca), "crt": str(crt), "key": str(key)}


@pytest.fixture(scope="session")
def cluster():
    state = ClusterState(dict)
    state.set_states(
        {
            "node-a": NodeState(gpus("a", 2), {}),
            "node-b": NodeState(gpus("b", 4, 40960), {}),
        }
    )
    return state


@pytest.fixture(scope="session")
def webhook(tls, cluster):
    server = serve("127.0.0.1:0", WebhookApp(MutateConfig(), cluster), tls["crt"], tls["key"])
    yield {"port": server.server_address[1], "ca": tls["ca"]}
    server.shutdown()


class Client:
    """A keep-alive HTTPS client, as the API server is."""

    def __init__(self, port: int, ca: str) -> None:
        ctx = ssl.create_default_context(cafile=ca)
        self.conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)

    def post(self, path: str, body: Any):
        self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read())

    def get(self, path: str):
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read())


@pytest.fixture
def client(webhook):
    c = Client(webhook["port"], webhook["ca"])
    yield c
    c.conn.close()


def review(pod: Dict[str, Any], operation: str = "CREATE") -> Dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a",
            "operation": operation,
            "object": pod,
        },
    }


def _tokens(path: str) -> List[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def apply_patch(doc: Any, patch: List[Dict[str, Any]]) -> Any:
    """RFC 6902 add/replace/remove, enough for the webhook's patches (strict: bad paths raise)."""
    doc = copy.deepcopy(doc)
    for op in patch:
        *parents, last = _tokens(op["path"])
        target = doc
        for t in parents:
            target = target[int(t)] if isinstance(target, list) else target[t]
        if op["op"] == "add":
            if isinstance(target, list):
                if last == "-":
                    target.append(op["value"])
                else:
                    assert 0 <= int(last) <= len(target)
                    target.insert(int(last), op["value"])
            else:
                target[last] = op["value"]
        elif op["op"] == "replace":
            if isinstance(target, list):
                target[int(last)] = op["value"]
            else:
                assert last in target, op["path"]
                target[last] = op["value"]
        elif op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        else:
            raise AssertionError(f"unexpected op {op}")
    return doc


def to_v1pod(pod: Dict[str, Any]):
    """Load a pod dict into the kubernetes client's V1Pod model (fails on wrong shapes)."""
    from kubernetes.client import ApiClient

    return ApiClient()._ApiClient__deserialize(pod, "V1Pod")


class Kubelet(rpc.RegistrationServicer):
    """Serves Registration on kubelet.sock, as the kubelet does; records every request.

    `stop()` then `start()` is a kubelet restart: a new socket, the same records.
    """

    def __init__(self, directory: str) -> None:
        self.requests: queue.Queue[pb.RegisterRequest] = queue.Queue()
        self.seen: List[pb.RegisterRequest] = []
        self.path = os.path.join(directory, "kubelet.sock")
        self.start()

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        rpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()

    def Register(self, request, context):
        self.seen.append(request)
        self.requests.put(request)
        return pb.Empty()

    def stop(self) -> None:
        self.server.stop(0).wait()
        if os.path.exists(self.path):
            os.unlink(self.path)
