"""Stand-ins for the two sides the DRA plugin talks to: the API server (a local HTTP server that
serves ResourceClaims as resource.k8s.io/v1 documents them and records ResourceSlice writes) and
the kubelet (registration, then NodePrepare/UnprepareResources over the plugin's Unix sockets,
with stubs generated from the upstream protos)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

import grpc

from gpupool.kube.dra import dra_pb2 as dra
from gpupool.kube.dra import dra_pb2_grpc as dra_rpc
from gpupool.kube.dra import pluginregistration_pb2 as reg
from gpupool.kube.dra import pluginregistration_pb2_grpc as reg_rpc

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DRIVER = "gpu.gpupool.io"


class JsonHandler(BaseHTTPRequestHandler):
    """An API server stand-in's handler: JSON bodies in and out, quiet."""

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: Dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Dict[str, Any]:
        answer: Dict[str, Any] = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        return answer


def resource_claim(
    namespace: str, name: str, uid: str, results: Optional[List[Dict[str, Any]]], memory: str = "8Gi"
) -> Dict[str, Any]:
    """A ResourceClaim as the API server returns it once the scheduler allocated `results` (None: not allocated)."""
    claim: Dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "42"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": {"memory": memory}},
                        },
                    }
                ]
            }
        },
        "status": {},
    }
    if results is not None:
        claim["status"] = {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": "9d0c1b7a-0000-4000-8000-000000000001"}],
        }
    return claim


def result(device: str, memory: Optional[str] = "8Gi", request: str = "gpu", pool: str = "node-a") -> Dict[str, Any]:
    """One entry of status.allocation.devices.results for a shared device."""
    entry: Dict[str, Any] = {"request": request, "driver": DRIVER, "pool": pool, "device": device}
    if memory is not None:
        entry["shareID"] = "1b8e4d2c-7a3f-4e59-9b6d-0c2f8a1e3d47"
        entry["consumedCapacity"] = {"memory": memory}
    return entry


class ApiServer:
    """The API server stand-in: `claims[(ns, name)]` is served; `slice_writes` records (verb, body)."""

    def __init__(self) -> None:
        self.claims: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self.slices: Dict[str, Dict[str, Any]] = {}
        self.slice_writes: List[Tuple[str, Dict[str, Any]]] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(JsonHandler):
            def _not_found(self) -> None:
                self._answer(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "message": "not found"})

            def do_GET(self) -> None:
                parts = self.path.split("/")
                with stub.lock:
                    if self.path.startswith(SLICES + "/"):
                        found = stub.slices.get(parts[-1])
                    elif len(parts) == 8 and parts[6] == "resourceclaims":
                        found = stub.claims.get((parts[5], parts[7]))
                    else:
                        found = None
                self._answer(200, found) if found is not None else self._not_found()

            def do_POST(self) -> None:
                body = self._body()
                with stub.lock:
                    body["metadata"]["resourceVersion"] = "1"
                    stub.slices[body["metadata"]["name"]] = body
                    stub.slice_writes.append(("POST", body))
                self._answer(201, body)

            def do_PUT(self) -> None:
                body = self._body()
                name = self.path.split("/")[-1]
                with stub.lock:
                    if name not in stub.slices:
                        return self._not_found()
                    body["metadata"]["resourceVersion"] = str(int(stub.slices[name]["metadata"]["resourceVersion"]) + 1)
                    stub.slices[name] = body
                    stub.slice_writes.append(("PUT", body))
                self._answer(200, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add_claim(self, claim: Dict[str, Any]) -> None:
        with self.lock:
            self.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = claim

    def kubeconfig(self) -> str:
        """A kubeconfig naming this server (what $KUBECONFIG points a plugin outside a cluster to)."""
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
                "users": [{"name": "agent", "user": {"token": "stub-token"}}],
                "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "agent"}}],
                "current-context": "stub",
            }
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Kubelet:
    """The kubelet's side of DRA: registers a plugin from its registration socket, then calls it."""

    def __init__(self) -> None:
        self.info: Optional[reg.PluginInfo] = None
        self._channel: Optional[grpc.Channel] = None

    def register(self, registration_socket: str) -> reg.PluginInfo:
        with grpc.insecure_channel(f"unix://{registration_socket}") as channel:
            stub = reg_rpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=5)
            ok = info.type == "DRAPlugin" and "v1.DRAPlugin" in info.supported_versions
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=ok, error="" if ok else "unsupported"), timeout=5
            )
        self.info = info
        self.close()
        self._channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        return info

    @property
    def plugin(self) -> dra_rpc.DRAPluginStub:
        assert self._channel is not None, "register first"
        return dra_rpc.DRAPluginStub(self._channel)

    def prepare(self, *claims: Tuple[str, str, str]) -> dra.NodePrepareResourcesResponse:
        """NodePrepareResources for (namespace, uid, name) claims."""
        request = dra.NodePrepareResourcesRequest(claims=[dra.Claim(namespace=n, uid=u, name=m) for n, u, m in claims])
        return self.plugin.NodePrepareResources(request, timeout=10)

    def unprepare(self, *claims: Tuple[str, str, str]) -> dra.NodeUnprepareResourcesResponse:
        request = dra.NodeUnprepareResourcesRequest(
            claims=[dra.Claim(namespace=n, uid=u, name=m) for n, u, m in claims]
        )
        return self.plugin.NodeUnprepareResources(request, timeout=10)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
