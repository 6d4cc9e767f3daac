"""The node agent as a whole: `python -m gpupool kube agent` as a real process, driven the way a
node drives it — the kubelet over gRPC on unix sockets, the injected runner (gpupool-run.pyz)
over HTTP with a user token from the tokens Secret, and SIGTERM from the container runtime.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import grpc
import pytest
from conftest import stop_process
from waiting import holds, tail, wait_until

from gpupool.core.attestation import SOCKET_ENV
from gpupool.core.model import Claim, Holder
from gpupool.kube.deviceplugin import api_pb2 as pb
from gpupool.kube.deviceplugin import api_pb2_grpc as rpc
from gpupool.workload.client.http import HttpPoolClient

from .conftest import Kubelet

ROOT = Path(__file__).resolve().parents[2]
USER_TOKEN = "team-a-token-0123456789abcdef"
POD_UID = "3f6c1c1e-5b2a-4d7e-9a51-2f1d0c9e8b7a"
GONE_UID = "0b9d8c7e-1111-4222-8333-944455566677"
_URL_RE = re.compile(r"listening on (https?://\S+)")


@dataclass
class Agent:
    proc: subprocess.Popen
    url: str
    admin: str
    kubelet_dir: Path
    live_pods: Path
    log: Path
    context: Optional[ssl.SSLContext] = None  # an agent serving HTTPS: verified against the agents' CA

    @property
    def plugin_socket(self) -> Path:
        return self.kubelet_dir / "gpupool.sock"

    def get(self, path: str, token: Optional[str] = None) -> dict:
        req = urllib.request.Request(self.url + path)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=5, context=self.context) as resp:
            return json.loads(resp.read())

    def status(self) -> dict:
        return self.get("/v1/status", self.admin)

    def stop(self) -> int:
        return stop_process(self.proc)


def start_agent(base: Path, *extra: str, ca: Optional[str] = None) -> Agent:
    """`gpupool kube agent` on 127.0.0.1:0 with 2 emulated GPUs, a user token in its tokens dir."""
    kubelet_dir, tokens = base / "device-plugins", base / "tokens"
    kubelet_dir.mkdir(parents=True, exist_ok=True)
    tokens.mkdir(exist_ok=True)
    (tokens / "team-a").write_text(USER_TOKEN + "\n")
    log = base / "agent.log"
    args = [
        sys.executable,
        "-m",
        "gpupool",
        "-v",
        "kube",
        "agent",
        "--kubelet-dir",
        str(kubelet_dir),
        "--devices",
        "emulated:2x16GiB",
        "--listen",
        "127.0.0.1:0",
        "--state",
        str(base / "state"),
        "--token-file",
        str(base / "admin-token"),
        "--tokens-dir",
        str(tokens),
        "--node",
        "node-a",
        "--live-pods-file",
        str(base / "live-pods"),
        "--reap-interval",
        "0.2",
        *extra,
    ]
    env = dict(os.environ, HOME=str(base), GPUPOOL_CONFIG=str(base / "no-client.yaml"))
    env.pop("NODE_IP", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=base)

    def listening():
        if proc.poll() is not None:
            pytest.fail(f"the agent exited with {proc.returncode}:\n{log.read_text()}")
        match = _URL_RE.search(log.read_text())
        return match.group(1) if match else None

    url = wait_until(listening, 20, "the agent to listen", detail=lambda: tail(log))
    context = ssl.create_default_context(cafile=ca) if ca else None
    admin = (base / "admin-token").read_text().strip()
    agent = Agent(proc, url, admin, kubelet_dir, base / "live-pods", log, context)
    wait_until(lambda: _healthy(agent), 10, "/healthz", detail=lambda: tail(log))
    return agent


def _healthy(agent: Agent) -> bool:
    try:
        return agent.get("/healthz") == {"status": "ok"}
    except (urllib.error.URLError, ConnectionError):
        return False


def plugin_stub(agent: Agent):
    channel = grpc.insecure_channel(f"unix://{agent.plugin_socket}")
    return channel, rpc.DevicePluginStub(channel)


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    """gpupool-run.pyz built from this tree (what the webhook's init container installs)."""
    target = tmp_path_factory.mktemp("dist") / "gpupool-run.pyz"
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_pyz.py"), str(target)], check=True, capture_output=True, timeout=60
    )
    return target


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A kubelet stand-in, then the agent (the order of a node's boot)."""
    base = tmp_path_factory.mktemp("node")
    (base / "device-plugins").mkdir()
    kubelet = Kubelet(str(base / "device-plugins"))
    agent = start_agent(base)
    yield kubelet, agent
    agent.stop()
    kubelet.stop()


def test_registers_streams_units_and_allocates_the_agent_address(node):
    kubelet, agent = node
    wait_until(lambda: kubelet.seen, 10, "the plugin to register", detail=lambda: tail(agent.log))
    req = kubelet.seen[0]
    assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "gpupool.sock", "gpupool.io/gpu")
    channel, dp = plugin_stub(agent)
    with channel:
        stream = dp.ListAndWatch(pb.Empty(), timeout=10)
        units = next(stream).devices
        stream.cancel()
        assert len(units) == 200 and {u.health for u in units} == {"Healthy"}
        ids = [u.ID for u in units]
        resp = dp.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:50])]), timeout=5
        )
        envs = resp.container_responses[0].envs
        assert envs["GPUPOOL_SERVER"] == agent.url and envs["GPUPOOL_NODE_AGENT"] == agent.url
        assert envs["GPUPOOL_UNITS"] == "50"
        # The attestation socket's folder, read-only, from Allocate: the pod spec needs no hostPath.
        attest = (agent.kubelet_dir.parent / "state").resolve() / "attest"
        assert envs[SOCKET_ENV] == str(attest / "attest.sock")
        mounts = [(m.container_path, m.host_path, m.read_only) for m in resp.container_responses[0].mounts]
        assert mounts == [(str(attest), str(attest), True)]


def test_serves_the_node_pool(node):
    _, agent = node
    assert agent.get("/healthz") == {"status": "ok"}
    status = agent.status()
    assert status["node"] == "node-a"
    assert [(d["memory_mib"], d["healthy"]) for d in status["devices"]] == [(16384, True), (16384, True)]
    with pytest.raises(urllib.error.HTTPError) as err:
        agent.get("/v1/status")  # not on loopback in a cluster: auth is on
    assert err.value.code == 401


def test_serves_the_dashboard(node):
    """The node agent runs the server's app: its web dashboard too, behind the same tokens."""
    _, agent = node
    req = urllib.request.Request(agent.url + "/ui/live", headers={"Authorization": f"Bearer {agent.admin}"})
    with urllib.request.urlopen(req, timeout=10, context=agent.context) as resp:
        page = resp.read().decode()
    assert resp.headers["content-type"].startswith("text/html") and page.count('class="gpu"') == 2
    with pytest.raises(urllib.error.HTTPError) as err:
        agent.get("/ui/live")
    assert err.value.code == 401


def test_runner_claims_by_pod_identity_and_the_reaper_releases_gone_pods(node, pyz, tmp_path):
    _, agent = node
    python = shutil.which("python3") or sys.executable
    go, seen = tmp_path / "go", tmp_path / "seen.json"
    child = (
        "import json, os, time, pathlib\n"
        f"pathlib.Path({str(seen)!r}).write_text(json.dumps({{k: v for k, v in os.environ.items() "
        "if k.startswith(('GPUPOOL_', 'CUDA_'))}))\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "raise SystemExit(7)\n"
    )
    label = f"pod:team-a/trainer:{POD_UID}"
    # The webhook's wrapped command, with the env the pod spec gives it (GPUPOOL_TOKEN from the
    # namespace's gpupool-client Secret, the same token the agent reads from gpupool-tokens).
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GPUPOOL_TOKEN": USER_TOKEN, "GPUPOOL_POD_UID": POD_UID}
    runner = subprocess.Popen(
        [
            python,
            str(pyz),
            "run",
            "-n",
            "1",
            "-p",
            "0.5",
            "--wait",
            "10",
            "--server",
            agent.url,
            "--label",
            label,
            "--",
            python,
            "-c",
            child,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        wait_until(lambda: seen.exists() or runner.poll() is not None, 15, "the runner's child to start")
        assert runner.poll() is None, runner.stdout.read().decode()
        leases = agent.status()["leases"]
        assert [(x["holder"]["label"], x["holder"]["name"]) for x in leases] == [(label, "team-a")]
        (lease,) = leases
        assert [d["memory_mib"] for d in lease["devices"]] == [8192]
        child_env = json.loads(seen.read_text())
        assert child_env["GPUPOOL_LEASE_ID"] == lease["id"]
        # The runner proved its pid on the agent's socket: the watchdog counts its tree against the lease.
        attested = json.loads((agent.kubelet_dir.parent / "state" / "attestations.json").read_text())
        assert [w["pid"] for w in attested[lease["id"]]] == [runner.pid]
        assert child_env["CUDA_VISIBLE_DEVICES"] == lease["devices"][0]["uuid"]

        # A pod that is gone, whose runner never released (node crash, kill -9).
        admin = HttpPoolClient(agent.url, token=agent.admin)
        try:
            orphan = admin.claim(
                Claim.single(1, fraction=0.25), Holder("team-a", 1, "gone", f"pod:team-a/gone:{GONE_UID}"), ttl_s=120
            )
        finally:
            admin.close()
        # reaper passes without a pod list (no file yet): unknown is not "no pods", look after look
        holds(
            lambda: orphan.id in {x["id"] for x in agent.status()["leases"]},
            1.0,
            "the gone pod's lease kept while no pod list exists",
            checks=3,
            detail=lambda: tail(agent.log),
        )
        agent.live_pods.write_text(f"# pods on node-a\n{POD_UID}\n")

        def orphan_released():
            ids = {x["id"] for x in agent.status()["leases"]}
            return orphan.id not in ids and ids == {lease["id"]}

        wait_until(orphan_released, 10, "the reaper to release the gone pod's lease", detail=lambda: tail(agent.log))

        go.touch()
        assert runner.wait(15) == 7, runner.stdout.read().decode()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert agent.status()["leases"] == []


def test_reregisters_when_the_kubelet_restarts(node):
    kubelet, agent = node
    wait_until(
        lambda: kubelet.seen and agent.plugin_socket.exists(),
        10,
        "the first registration",
        detail=lambda: tail(agent.log),
    )
    before = len(kubelet.seen)
    # A restarted kubelet comes with a new kubelet.sock and wipes the plugin sockets.
    kubelet.stop()
    agent.plugin_socket.unlink()
    kubelet.start()
    wait_until(lambda: len(kubelet.seen) > before, 10, "the plugin to register again", detail=lambda: tail(agent.log))
    assert kubelet.seen[-1].resource_name == "gpupool.io/gpu"
    wait_until(agent.plugin_socket.exists, 10, "the plugin socket to come back", detail=lambda: tail(agent.log))
    channel, dp = plugin_stub(agent)
    with channel:
        stream = dp.ListAndWatch(pb.Empty(), timeout=10)
        assert len(next(stream).devices) == 200
        stream.cancel()


def test_sigterm_stops_cleanly_with_a_watch_open(tmp_path):
    # No kubelet yet (it may start after the agent); the kubelet's stream is open at SIGTERM.
    agent = start_agent(tmp_path)
    try:
        wait_until(agent.plugin_socket.exists, 10, "the plugin socket", detail=lambda: tail(agent.log))
        channel, dp = plugin_stub(agent)
        with channel:
            stream = dp.ListAndWatch(pb.Empty(), timeout=120)
            assert len(next(stream).devices) == 200
            started = time.monotonic()
            agent.proc.send_signal(signal.SIGTERM)
            code = agent.proc.wait(60)
            took = time.monotonic() - started
            try:  # the stream ends with the plugin (closed, or cut): it does not hang until its timeout
                list(stream)
            except grpc.RpcError as err:
                assert err.code() != grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        agent.stop()
    assert code == 0, agent.log.read_text()
    assert took < 60, f"shutdown took {took:.1f}s"  # not held by the open stream (its 120 s)
    assert not agent.plugin_socket.exists()
    assert not _healthy(agent)
    assert "Traceback" not in agent.log.read_text()


def test_webhook_process_serves_https_and_sees_the_agent(node, tls):
    """`gpupool kube webhook` as a process: /healthz over TLS, the agent's GPUs in the extender, SIGTERM."""

    _, agent = node
    token_file = agent.log.parent / "admin-token"
    args = [
        sys.executable,
        "-m",
        "gpupool",
        "kube",
        "webhook",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        tls["crt"],
        "--tls-key",
        tls["key"],
        "--agents",
        f"node-a={agent.url},node-x=http://127.0.0.1:9",
        "--agent-token-file",
        str(token_file),
        "--refresh",
        "0.2",
    ]
    log = agent.log.parent / "webhook.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = (
            wait_until(
                lambda: proc.poll() is None and re.search(r"listening on (https://\S+)", log.read_text()),
                20,
                "the webhook to listen",
                detail=lambda: tail(log),
            )
            .group(1)
            .replace("127.0.0.1", "localhost")
        )
        ctx = ssl.create_default_context(cafile=tls["ca"])

        def call(path: str, body: Optional[dict] = None) -> dict:
            data = json.dumps(body).encode() if body is not None else None
            req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                return json.loads(resp.read())

        # node-x has no agent answering: only node-a is known.
        wait_until(
            lambda: call("/healthz") == {"status": "ok", "nodes": 1},
            10,
            "the webhook to poll the agent",
            detail=lambda: tail(log),
        )

        def pod(units: str) -> dict:
            return {
                "metadata": {"name": "p", "uid": "u1"},
                "spec": {"containers": [{"name": "w", "resources": {"limits": {"gpupool.io/gpu": units}}}]},
            }

        half = call("/extender/filter", {"Pod": pod("50"), "NodeNames": ["node-a", "node-x"]})
        assert half["NodeNames"] == ["node-a"] and "node-x" in half["FailedNodes"]
        three = call("/extender/filter", {"Pod": pod("300"), "NodeNames": ["node-a"]})
        assert three["NodeNames"] == [] and "node-a" in {**three["FailedNodes"], **three["FailedAndUnresolvableNodes"]}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
