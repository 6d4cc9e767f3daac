"""A pod's share decided once: the extender's bind verb places the pod's claim on the node the
scheduler picked, records the GPUs on the pod (gpupool.io/choice) and binds it, against an API
server stand-in on loopback (the paths, verbs, content types and objects of the core/v1 API);
the device plugin's GetPreferredAllocation then gives the recorded GPUs' units over gRPC instead
of choosing again, and chooses itself (with a log line) only when nothing recorded fits."""

from __future__ import annotations

import http.client
import json
import logging
import threading
import urllib.parse
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import grpc
import pytest
from envs import clean_env

from gpupool.kube import annotations as ann
from gpupool.kube.admission import WebhookApp, serve
from gpupool.kube.apiclient import KubeApi
from gpupool.kube.choice import Choice, gpus_for_units, pinned_claim
from gpupool.kube.deviceplugin import api_pb2 as pb
from gpupool.kube.deviceplugin import api_pb2_grpc as rpc
from gpupool.kube.deviceplugin.plugin import DevicePlugin, PluginConfig
from gpupool.kube.extender import NodeState, pod_claim
from gpupool.kube.manifests import scheduler_config
from gpupool.kube.mutate import MutateConfig, mutate
from gpupool.kube.nodestate import ClusterState
from gpupool.kube.validate import validate

from .conftest import Kubelet, apply_patch, gpus, to_v1pod
from .dra_stand_ins import JsonHandler

pytest.importorskip("kubernetes")
NODE_A = gpus("a", 2)  # GPU-a-0, GPU-a-1, 16 GiB each


def user_pod(name: str, limits: Dict[str, str], policy: str = "binpack", uid: str = "") -> Dict[str, Any]:
    """A pod as a user writes it, passed through the mutating webhook's patch, as the API stores it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": uid or f"uid-{name}", "annotations": {}},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "train",
                    "image": "python:3.11",
                    "command": ["python", "t.py"],
                    "resources": {"limits": limits},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }
    if policy:
        pod["metadata"]["annotations"][ann.POLICY] = policy
    mutated = apply_patch(pod, mutate(pod, MutateConfig()).patch)
    to_v1pod(mutated)  # shaped as the API documents a Pod
    return mutated


class ApiServer:
    """The core/v1 pod calls the binder makes: GET a pod, PATCH it (merge patch), POST its binding."""

    def __init__(self) -> None:
        self.pods: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self.calls: List[Tuple[str, str]] = []
        outer = self

        class Handler(JsonHandler):
            def _status(self, code: int, reason: str, message: str) -> None:
                self._answer(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": message,
                        "reason": reason,
                        "code": code,
                    },
                )

            def _pod(self) -> Tuple[Optional[Dict[str, Any]], List[str]]:
                parts = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(self.path).path.split("/")]
                # ['', 'api', 'v1', 'namespaces', NS, 'pods', NAME, (binding)]
                if len(parts) < 7 or parts[1:4] != ["api", "v1", "namespaces"] or parts[5] != "pods":
                    return None, parts
                return outer.pods.get((parts[4], parts[6])), parts

            def do_GET(self) -> None:
                outer.calls.append(("GET", self.path))
                path = urllib.parse.urlsplit(self.path)
                if path.path == "/api/v1/pods":  # the agent's list of the node's Pending pods
                    query = urllib.parse.parse_qs(path.query).get("fieldSelector", [""])[0]
                    node = dict(f.split("=", 1) for f in query.split(",") if f).get("spec.nodeName")
                    items = [p for p in outer.pods.values() if p["spec"].get("nodeName") == node]
                    self._answer(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
                    return
                pod, parts = self._pod()
                if pod is None:
                    self._status(404, "NotFound", f'pods "{parts[-1]}" not found')
                else:
                    self._answer(200, pod)

            def do_PATCH(self) -> None:
                outer.calls.append(("PATCH", self.path))
                pod, parts = self._pod()
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    self._status(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
                elif pod is None:
                    self._status(404, "NotFound", f'pods "{parts[-1]}" not found')
                else:
                    patch = self._body()
                    pod["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])
                    self._answer(200, pod)

            def do_POST(self) -> None:
                outer.calls.append(("POST", self.path))
                pod, parts = self._pod()
                binding = self._body()
                if pod is None or parts[-1] != "binding":
                    self._status(404, "NotFound", f'pods "{parts[6] if len(parts) > 6 else "?"}" not found')
                elif pod["spec"].get("nodeName"):
                    self._status(
                        409,
                        "Conflict",
                        f"Operation cannot be fulfilled on pods/binding "
                        f'"{parts[6]}": pod {parts[6]} is already assigned to node '
                        f'"{pod["spec"]["nodeName"]}"',
                    )
                elif binding.get("kind") != "Binding" or (binding.get("target") or {}).get("kind") != "Node":
                    self._status(400, "BadRequest", "not a Binding to a Node")
                elif binding["metadata"].get("uid") not in (None, pod["metadata"]["uid"]):
                    self._status(409, "Conflict", "Precondition failed: UID in precondition does not match")
                else:
                    pod["spec"]["nodeName"] = binding["target"]["name"]
                    self._answer(
                        201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
                    )

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add(self, pod: Dict[str, Any]) -> Dict[str, Any]:
        self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        return pod

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api():
    server = ApiServer()
    yield server
    server.close()


@pytest.fixture
def extender(api):
    """The webhook server (plain HTTP here) with the extender's bind verb over the stand-in."""
    cluster = ClusterState(dict)
    # GPU-a-0 60 % used, GPU-a-1 free; node-b full.
    b = gpus("b", 1)
    cluster.set_states(
        {"node-a": NodeState(NODE_A, {NODE_A[0].uuid: 9830}), "node-b": NodeState(b, {b[0].uuid: 16384})}
    )
    server = serve("127.0.0.1:0", WebhookApp(MutateConfig(), cluster, KubeApi.at(api.url)))
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)

    def bind(args: Dict[str, Any]) -> Dict[str, Any]:
        conn.request("POST", "/extender/bind", json.dumps(args), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200  # the protocol's errors travel in the result
        return json.loads(resp.read())

    yield bind
    conn.close()
    server.shutdown()


def binding_args(pod: Dict[str, Any], node: str) -> Dict[str, Any]:
    """ExtenderBindingArgs as kube-scheduler sends it (Go field names, no json tags)."""
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


def test_bind_records_the_choice_before_binding(api, extender):
    pod = api.add(user_pod("p1", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"}))
    assert extender(binding_args(pod, "node-a")) == {"Error": ""}
    assert pod["spec"]["nodeName"] == "node-a"
    choice = Choice.decode(pod["metadata"]["annotations"][ann.CHOICE])
    # binpack: the fuller GPU that holds 30 %, as core placement decides on the agent's state.
    assert choice == Choice("node-a", {"train": (NODE_A[0].uuid,)})
    # the runner's claim: the container's ask on that GPU
    assert json.loads(pod["metadata"]["annotations"][ann.chosen_gpu_key(0)]) == {
        "requests": [{"count": 1, "fraction": 0.3, "memory_mib": None, "filters": [f"device.uuid={NODE_A[0].uuid}"]}],
        "policy": "binpack",
    }
    assert [m for m, _ in api.calls] == ["GET", "PATCH", "POST"]  # recorded, then bound
    assert api.calls[-1][1] == "/api/v1/namespaces/team-a/pods/p1/binding"


def test_two_gpus_each_with_the_share_are_two_distinct_gpus(api, extender):
    pod = api.add(user_pod("p2", {"gpupool.io/gpu-amount": "2", "gpupool.io/gpu-percent": "40"}))
    assert extender(binding_args(pod, "node-a")) == {"Error": ""}
    choice = Choice.decode(pod["metadata"]["annotations"][ann.CHOICE])
    assert choice is not None and sorted(choice.gpus["train"]) == sorted(d.uuid for d in NODE_A)
    # the runner's claim names the same two GPUs, one request each, 40 % on each
    runner = json.loads(pod["metadata"]["annotations"][ann.chosen_gpu_key(0)])
    assert [(r["count"], r["fraction"], r["filters"]) for r in runner["requests"]] == [
        (1, 0.4, [f"device.uuid={u}"]) for u in choice.gpus["train"]
    ]


def test_binds_between_two_refreshes_are_not_given_one_slice(api, extender):
    # No refresh of the agents' state in between (it comes every few seconds; kube-scheduler binds
    # several pods in that time): the second bind counts the first one's GPU at once.
    first = api.add(user_pod("q1", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "40"}))
    second = api.add(user_pod("q2", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "40"}))
    third = api.add(user_pod("q3", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "70"}))
    for pod in (first, second):
        assert extender(binding_args(pod, "node-a")) == {"Error": ""}
    chosen = [Choice.decode(p["metadata"]["annotations"][ann.CHOICE]).gpus["train"] for p in (first, second)]
    # GPU-a-0 is 60 % used: 40 % fits there once; the second goes to GPU-a-1.
    assert chosen == [(NODE_A[0].uuid,), (NODE_A[1].uuid,)]
    # 70 % fits on neither now (100 % and 40 % used): the bind says so and records nothing.
    error = extender(binding_args(third, "node-a"))["Error"]
    assert "0 of 2 matching GPUs have that much free" in error and ann.CHOICE not in third["metadata"]["annotations"]


@pytest.mark.parametrize(
    "change, node, says",
    [
        ({}, "node-b", "node node-b"),  # full now: the placement's reason
        ({"uid": "another"}, "node-a", "no longer the one of UID"),  # replaced since it was scheduled
        ({"bound": "node-b"}, "node-a", "already assigned to node"),  # the API's own 409 message
        ({"name": "../../nodes/x"}, "node-a", "not found"),  # a name cannot add a path segment
    ],
)
def test_a_bind_that_cannot_hold_is_an_error_and_nothing_is_recorded(api, extender, change, node, says):
    pod = api.add(user_pod("p3", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "50"}))
    args = binding_args(pod, node)
    if "uid" in change:
        args["PodUID"] = change["uid"]
    if "bound" in change:
        pod["spec"]["nodeName"] = change["bound"]
    if "name" in change:
        args["PodName"] = change["name"]
    result = extender(args)
    assert says in result["Error"] and result["Error"].startswith("gpupool extender: ")
    if "bound" not in change:
        assert "nodeName" not in pod["spec"]
    if "bound" in change:  # recorded, then the API refused the binding: the next bind records again
        assert api.calls[-1][0] == "POST"
    else:
        assert ann.CHOICE not in pod["metadata"]["annotations"]


def test_a_pod_without_gpus_is_bound_without_a_choice(api, extender):
    pod = api.add(user_pod("cpu", {}, policy=""))
    assert extender(binding_args(pod, "node-a")) == {"Error": ""}
    assert pod["spec"]["nodeName"] == "node-a" and ann.CHOICE not in (pod["metadata"].get("annotations") or {})


def test_bind_without_the_api_server_says_so():
    cluster = ClusterState(dict)
    assert (
        "Kubernetes API"
        in WebhookApp(MutateConfig(), cluster).handle(
            "POST", "/extender/bind", b'{"PodName":"p","PodNamespace":"n","Node":"a"}'
        )[1]["Error"]
    )


def test_scheduler_config_binds_by_default_and_is_then_not_ignorable(capsys):
    import yaml

    from gpupool.cli.main import main

    (binder,) = scheduler_config("10.96.0.200")["extenders"]
    assert binder["bindVerb"] == "bind" and binder["ignorable"] is False
    (plain,) = scheduler_config("10.96.0.200", bind=False)["extenders"]
    assert "bindVerb" not in plain and plain["ignorable"] is True
    for flags, verb in (([], "bind"), (["--bind"], "bind"), (["--no-bind"], None)):
        assert main(["kube", "scheduler-config", "--cluster-ip", "10.96.0.200", *flags]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["extenders"][0].get("bindVerb") == verb
    # the webhook's default follows, and turns off the same way
    from gpupool.cli.main import build_parser

    assert MutateConfig().pin_choice is True
    assert build_parser().parse_args(["kube", "webhook"]).bind is True
    assert build_parser().parse_args(["kube", "webhook", "--no-bind"]).bind is False


def test_the_device_plugin_gives_the_recorded_gpus_units(api, extender, tmp_path, caplog):
    pod = api.add(user_pod("p4", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"}))
    assert extender(binding_args(pod, "node-a")) == {"Error": ""}
    recorded_gpu = NODE_A[0].uuid
    lookups: List[int] = []
    client = KubeApi.at(api.url)

    def lookup(units: int) -> List[Tuple[str, ...]]:
        lookups.append(units)
        query = urllib.parse.urlencode({"fieldSelector": "spec.nodeName=node-a,status.phase=Pending"})
        pods = client.request("GET", f"/api/v1/pods?{query}")["items"]
        return gpus_for_units(pods, "node-a", units)

    kubelet_dir = tmp_path / "dp"
    kubelet_dir.mkdir()
    plugin = DevicePlugin(NODE_A, PluginConfig(kubelet_dir=str(kubelet_dir), watch_interval_s=0.1, recorded=lookup))
    kubelet = Kubelet(str(kubelet_dir))
    try:
        plugin.start()
        kubelet.requests.get(timeout=5)
        by_gpu = {d.uuid: [u for u, dev in plugin.units if dev.uuid == d.uuid] for d in NODE_A}
        # The kubelet's view: GPU-a-0 all free, GPU-a-1 half taken. Alone, the plugin would put 30
        # units on the fuller GPU-a-1; the extender recorded GPU-a-0.
        available = by_gpu[NODE_A[0].uuid] + by_gpu[NODE_A[1].uuid][50:]

        def preferred(size: int) -> List[str]:
            channel = grpc.insecure_channel(f"unix://{plugin.socket_path}")
            with channel:
                resp = rpc.DevicePluginStub(channel).GetPreferredAllocation(
                    pb.PreferredAllocationRequest(
                        container_requests=[
                            pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=size)
                        ]
                    ),
                    timeout=5,
                )
            return list(resp.container_responses[0].deviceIDs)

        ids = preferred(30)
        assert len(ids) == 30 and {plugin.table[u].uuid for u in ids} == {recorded_gpu}
        # No pod recorded for 20 units: the plugin chooses (the fuller GPU), and says so.
        with caplog.at_level(logging.INFO, logger="gpupool.kube.deviceplugin.plugin"):
            ids = preferred(20)
        assert {plugin.table[u].uuid for u in ids} == {NODE_A[1].uuid}
        assert "no recorded GPU choice holds 20 units" in caplog.text
        assert lookups == [30, 20]
    finally:
        kubelet.stop()
        plugin.stop()


def test_a_bound_pod_not_started_counts_on_its_recorded_gpus():
    pod = user_pod("p5", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"})
    state = NodeState(NODE_A, {NODE_A[0].uuid: 9830})
    # Recorded on the free GPU-a-1 (the state when it was bound); placing its claim again would
    # pick the fuller GPU-a-0 (binpack).
    pod["metadata"]["annotations"][ann.CHOICE] = Choice("node-a", {"train": (NODE_A[1].uuid,)}).encode()
    again = state.with_pending([(pod["metadata"]["uid"], pod_claim(pod))])
    assert again.allocated[NODE_A[0].uuid] > 9830
    pinned = state.with_pending([(pod["metadata"]["uid"], pinned_claim(pod))])
    assert pinned.allocated == {NODE_A[0].uuid: 9830, NODE_A[1].uuid: 4915}


def test_two_containers_recorded_on_one_gpu_count_there_both():
    pod = user_pod("p6", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"})
    second = dict(pod["spec"]["containers"][0], name="helper")
    pod["spec"]["containers"].append(second)
    asks = ann.decode_claim(pod["metadata"]["annotations"][ann.CLAIM])
    assert asks is not None
    pod["metadata"]["annotations"][ann.CLAIM] = ann.encode_claim({"train": asks["train"], "helper": asks["train"]})
    pod["metadata"]["annotations"][ann.CHOICE] = Choice(
        "node-a", {"train": (NODE_A[1].uuid,), "helper": (NODE_A[1].uuid,)}
    ).encode()
    pinned = NodeState(NODE_A, {}).with_pending([("u", pinned_claim(pod))])
    assert pinned.allocated == {NODE_A[1].uuid: 2 * 4915}
    # A record that does not match the claim (one GPU short) is not used.
    pod["metadata"]["annotations"][ann.CHOICE] = Choice("node-a", {"train": (NODE_A[1].uuid,)}).encode()
    assert pinned_claim(pod) is None


def test_a_new_pod_carrying_a_choice_is_denied():
    pod = user_pod("p7", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"})
    assert validate(pod).allowed
    pod["metadata"]["annotations"][ann.CHOICE] = Choice("node-a", {"train": (NODE_A[1].uuid,)}).encode()
    verdict = validate(pod)
    assert not verdict.allowed and ann.CHOICE in verdict.message and "remove them" in verdict.message
    del pod["metadata"]["annotations"][ann.CHOICE]
    pod["metadata"]["annotations"][ann.chosen_gpu_key(0)] = NODE_A[1].uuid  # the runner's pin alone
    assert not validate(pod).allowed


def test_a_plugin_sharing_the_pools_mix_does_not_count_asks_twice(tmp_path):
    from gpupool.core.fragmentation import LearnedMix

    shared = LearnedMix()
    own = DevicePlugin(NODE_A, PluginConfig(kubelet_dir=str(tmp_path)))
    node = DevicePlugin(NODE_A, PluginConfig(kubelet_dir=str(tmp_path)), mix=shared)
    assert node.mix is shared and own.mix is not shared
    for plugin in (own, node):
        plugin.learn(30)
        plugin.learn(200)
    assert own.mix.histogram.observed == 2
    assert shared.histogram.observed == 0  # the pool counts the claims when the runners claim


def test_the_binders_rbac_grants_what_the_bind_calls_and_nothing_more(api, extender):
    import yaml

    path = Path(__file__).resolve().parents[2] / "deploy" / "scheduler" / "binder-rbac.yaml"
    role, binding = list(yaml.safe_load_all(path.read_text()))
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    pod = api.add(user_pod("p8", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"}))
    assert extender(binding_args(pod, "node-a")) == {"Error": ""}
    verb = {"GET": "get", "PATCH": "patch", "POST": "create"}
    used = {("pods/binding" if p.endswith("/binding") else "pods", verb[m]) for m, p in api.calls}
    assert granted == used == {("pods", "get"), ("pods", "patch"), ("pods/binding", "create")}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpupool-webhook", "namespace": "gpupool-system"}]


def test_only_pending_pods_bound_here_with_a_choice_for_here_are_candidates():
    def bound(name: str, node: str, recorded_for: str, phase: str = "Pending") -> Dict[str, Any]:
        pod = user_pod(name, {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"})
        pod["spec"]["nodeName"], pod["status"]["phase"] = node, phase
        pod["metadata"]["annotations"][ann.CHOICE] = Choice(recorded_for, {"train": (f"GPU-{name}",)}).encode()
        return pod

    pods = [
        bound("ok", "node-a", "node-a"),
        bound("running", "node-a", "node-a", phase="Running"),
        bound("elsewhere", "node-b", "node-b"),
        bound("stale", "node-a", "node-b"),  # recorded for another node: not this node's choice
    ]
    assert gpus_for_units(pods, "node-a", 30) == [("GPU-ok",)]
    assert gpus_for_units(pods, "node-a", 31) == []


def kubelet_expands(pod: Dict[str, Any], index: int, server: str) -> Tuple[List[str], Dict[str, str]]:
    """The runner's arguments of container `index` as the kubelet starts it: downward-API env from the
    pod's fields and annotations, then $(VAR) expanded in the command (Kubernetes' rules, enough here)."""
    container = pod["spec"]["containers"][index]
    env: Dict[str, str] = {}
    for e in container["env"]:
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        if ref and ref["fieldPath"].startswith("metadata.annotations['"):
            env[e["name"]] = pod["metadata"]["annotations"].get(
                ref["fieldPath"][len("metadata.annotations['") : -2], ""
            )
        elif ref:
            env[e["name"]] = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": "team-a"}.get(
                ref["fieldPath"], pod["metadata"]["uid"]
            )
        elif "value" in e:
            env[e["name"]] = e["value"]
    env["GPUPOOL_SERVER"] = server
    command = list(container["command"])
    for i, arg in enumerate(command):
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        command[i] = arg
    return command[command.index("run") + 1 : command.index("--")], env


def run_in_pod(node_pool: Any, args: List[str], env: Dict[str, str], home: Path) -> Tuple[List[str], str]:
    """`gpupool run ARGS -- print CUDA_VISIBLE_DEVICES` with a container's env: (its GPUs, its stderr)."""
    import subprocess
    import sys

    base = clean_env()
    full = dict(base, **env, GPUPOOL_TOKEN=node_pool.token or "", HOME=str(home), GPUPOOL_STATE=str(home / "x"))
    child = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "run", *args, "--", sys.executable, "-c", child],
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(","), done.stderr


def node_devices(node_pool: Any) -> Tuple[Any, ...]:
    from gpupool.workload.client.http import HttpPoolClient

    status = HttpPoolClient(node_pool.url, node_pool.token or "").request("GET", "/v1/status")
    return NodeState.from_status(status).devices


def gpu_pod(name: str, limits: Dict[str, str], config: MutateConfig) -> Dict[str, Any]:
    """A binpack pod through the mutating webhook (`config`), shaped as the API documents a Pod."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "annotations": {ann.POLICY: "binpack"}},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "python:3.11",
                    "command": ["python", "t.py"],
                    "resources": {"limits": limits},
                }
            ]
        },
        "status": {"phase": "Pending"},
    }
    pod = apply_patch(pod, mutate(pod, config).patch)
    to_v1pod(pod)
    return pod


class NodePlugin:
    """The node's device plugin on a kubelet stand-in, asked over its real gRPC socket."""

    def __init__(self, devices: Any, directory: Path, lookup: Any = None) -> None:
        directory.mkdir()
        self.plugin = DevicePlugin(
            devices, PluginConfig(kubelet_dir=str(directory), watch_interval_s=0.1, recorded=lookup)
        )
        self.kubelet = Kubelet(str(directory))
        self.plugin.start()
        self.kubelet.requests.get(timeout=5)

    def units_of(self, uuid: str) -> List[str]:
        return [u for u, d in self.plugin.units if d.uuid == uuid]

    def allocate(self, available: List[str], size: int) -> Tuple[List[str], Dict[str, str]]:
        """What the kubelet does for a container of `size` units: GetPreferredAllocation, then
        Allocate of the preferred IDs: (the IDs, the env Allocate gives the container)."""
        with grpc.insecure_channel(f"unix://{self.plugin.socket_path}") as channel:
            stub = rpc.DevicePluginStub(channel)
            preferred = stub.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=size)
                    ]
                ),
                timeout=5,
            )
            ids = list(preferred.container_responses[0].deviceIDs)
            answer = stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=5
            )
        return ids, dict(answer.container_responses[0].envs)

    def close(self) -> None:
        self.kubelet.stop()
        self.plugin.stop()


def pending_lookup(api: ApiServer, node: str) -> Any:
    """The agent's read of the recorded choices (kube_recorded), through the API stand-in."""
    client = KubeApi.at(api.url)

    def lookup(units: int) -> List[Tuple[str, ...]]:
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node},status.phase=Pending"})
        return gpus_for_units(client.request("GET", f"/api/v1/pods?{query}")["items"], node, units)

    return lookup


def test_the_runner_claims_the_gpu_the_bind_recorded(api, server_factory, tmp_path):
    node_pool = server_factory()
    devices = node_devices(node_pool)
    # The extender saw GPU 1 60 % used (the node's pool has both free): binpack records GPU 1,
    # where the node's pool alone would put the share on GPU 0.
    cluster = ClusterState(dict)
    cluster.set_states({"node-a": NodeState(devices, {devices[1].uuid: 9830})})
    pod = api.add(gpu_pod("pinned", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"}, MutateConfig()))
    app = WebhookApp(MutateConfig(), cluster, KubeApi.at(api.url))
    assert app.handle("POST", "/extender/bind", json.dumps(binding_args(pod, "node-a")).encode())[1] == {"Error": ""}

    args, env = kubelet_expands(pod, 0, node_pool.url)
    assert "--wait" in args and not {"-n", "-p", "-m", "--filter"} & set(args)  # the share is not repeated
    assert json.loads(env["GPUPOOL_CLAIM"]) == json.loads(pod["metadata"]["annotations"][ann.chosen_gpu_key(0)])
    assert run_in_pod(node_pool, args, {"GPUPOOL_CLAIM": env["GPUPOOL_CLAIM"]}, tmp_path)[0] == [devices[1].uuid]
    # what the node's pool chooses alone, for the same share from flags
    assert run_in_pod(node_pool, ["-n", "1", "-p", "0.3", *args], {}, tmp_path)[0] == [devices[0].uuid]


@pytest.mark.parametrize(
    "limits, used, chosen",
    [
        # 2 x 50 %: GPU 0 full and GPUs 2 and 3 30 % used in the extender's view: binpack records 2 and 3
        ({"gpupool.io/gpu-amount": "2", "gpupool.io/gpu-percent": "50"}, {0: 16384, 2: 4915, 3: 4915}, [2, 3]),
        # 2 whole GPUs: GPU 0 30 % used: the first two empty ones, 1 and 2
        ({"gpupool.io/gpu-amount": "2", "gpupool.io/gpu-percent": "100"}, {0: 4915}, [1, 2]),
    ],
    ids=["2x50%", "2x100%"],
)
def test_a_multi_gpu_choice_is_followed_by_the_plugin_and_the_agent(
    api, server_factory, tmp_path, limits, used, chosen
):
    """A container of two GPUs: the bind records both, GetPreferredAllocation and Allocate (over
    gRPC) give those GPUs' units, and the runner claims exactly those two from the node's pool,
    which alone would take GPUs 0 and 1 (all four are free there)."""
    node_pool = server_factory("--devices", "emulated:4x16GiB")
    devices = node_devices(node_pool)
    cluster = ClusterState(dict)
    cluster.set_states({"node-a": NodeState(devices, {devices[i].uuid: mib for i, mib in used.items()})})
    pod = api.add(gpu_pod("multi", limits, MutateConfig()))
    app = WebhookApp(MutateConfig(), cluster, KubeApi.at(api.url))
    assert app.handle("POST", "/extender/bind", json.dumps(binding_args(pod, "node-a")).encode())[1] == {"Error": ""}
    recorded = Choice.decode(pod["metadata"]["annotations"][ann.CHOICE])
    assert recorded is not None and recorded.gpus["train"] == tuple(devices[i].uuid for i in chosen)

    plugin = NodePlugin(devices, tmp_path / "dp", pending_lookup(api, "node-a"))
    try:
        everything = [u for u, _ in plugin.plugin.units]  # the kubelet's view: every unit free
        size = int(pod["spec"]["containers"][0]["resources"]["limits"]["gpupool.io/gpu"])
        ids, allocated = plugin.allocate(everything, size)
    finally:
        plugin.close()
    per_gpu = size // 2
    assert sorted(ids) == sorted(u for i in chosen for u in plugin.units_of(devices[i].uuid)[:per_gpu])
    assert allocated["GPUPOOL_ALLOCATED_GPUS"] == ",".join(devices[i].uuid for i in chosen)
    assert allocated["GPUPOOL_UNITS"] == str(size)

    args, env = kubelet_expands(pod, 0, node_pool.url)
    container_env = {"GPUPOOL_CLAIM": env["GPUPOOL_CLAIM"], **allocated}
    container_env.pop("GPUPOOL_SERVER", None)
    visible, stderr = run_in_pod(node_pool, args, container_env, tmp_path)
    assert visible == [devices[i].uuid for i in chosen]
    assert "warning" not in stderr  # the kubelet's units and the claim name the same GPUs
    # the node's pool alone, for the same share given as flags
    share = ["-n", "2", "-p", "0.5" if limits["gpupool.io/gpu-percent"] == "50" else "1"]
    assert run_in_pod(node_pool, [*share, *args], {}, tmp_path)[0] == [devices[0].uuid, devices[1].uuid]


def test_without_binding_the_runner_pins_its_ask_to_the_gpus_the_plugin_allocated(server_factory, tmp_path):
    """`gpupool kube webhook --no-bind` (a scheduler that cannot call the extender): the container
    gets its ask as $GPUPOOL_CLAIM, the device plugin chooses the GPU (no recorded choice) and the
    runner claims there, where the node's pool alone would choose another."""
    node_pool = server_factory()
    devices = node_devices(node_pool)
    config = MutateConfig(pin_choice=False)
    pod = gpu_pod("unbound", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"}, config)
    (claim_env,) = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "GPUPOOL_CLAIM"]
    assert json.loads(claim_env["value"]) == {
        "requests": [{"count": 1, "fraction": 0.3, "memory_mib": None, "filters": []}],
        "policy": "binpack",
    }
    plugin = NodePlugin(devices, tmp_path / "dp")
    try:
        # the kubelet's view: GPU 0 all free, GPU 1 half taken; the plugin takes the fuller GPU 1
        available = plugin.units_of(devices[0].uuid) + plugin.units_of(devices[1].uuid)[50:]
        ids, allocated = plugin.allocate(available, 30)
    finally:
        plugin.close()
    assert {plugin.plugin.table[u].uuid for u in ids} == {devices[1].uuid}
    assert allocated["GPUPOOL_ALLOCATED_GPUS"] == devices[1].uuid
    args, env = kubelet_expands(pod, 0, node_pool.url)
    assert not {"-n", "-p", "-m"} & set(args)
    container_env = {"GPUPOOL_CLAIM": env["GPUPOOL_CLAIM"], "GPUPOOL_ALLOCATED_GPUS": devices[1].uuid}
    assert run_in_pod(node_pool, args, container_env, tmp_path)[0] == [devices[1].uuid]
    assert run_in_pod(node_pool, args, {"GPUPOOL_CLAIM": env["GPUPOOL_CLAIM"]}, tmp_path)[0] == [devices[0].uuid]


def test_a_pod_the_extender_did_not_bind_is_told_so(server_factory, tmp_path):
    """The downward API gives an absent annotation as "": the runner names the variable and the fix."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, GPUPOOL_CLAIM="", HOME=str(tmp_path), GPUPOOL_STATE=str(tmp_path / "s"))
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "run", "--", "true"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "$GPUPOOL_CLAIM is empty" in line and "--no-bind" in line and "scheduler-config" in line
