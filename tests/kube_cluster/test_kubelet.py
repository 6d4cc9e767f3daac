"""A real kubelet drives gpupool's node side: the kubelet built with the control plane runs pods
with containerd and runc (tools/kube_cluster/kubelet_node.py) on a node whose gpupool agent
serves the device plugin and the DRA kubelet plugin, as a DaemonSet pod would.

What each test asserts is what the kubelet did: the node it registered (its capacity from the
device plugin's ListAndWatch), the pods it ran (their states, their logs served by the kubelet
through the API server, their cgroups below `kubepods`), the env Allocate gave a container, the
runner it started in that container claiming and attesting from inside the pod's cgroup, and the
DRA claims it prepared and unprepared, read back from the agent's pool."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from waiting import wait_until

from gpupool.core.errors import Unauthorized
from gpupool.kube.resources import UNITS, UNITS_PER_GPU
from gpupool.pooling.isolation.env import ALLOCATED_GPUS_ENV, UNITS_ENV
from gpupool.workload.client.http import HttpPoolClient

from .cluster_fixture import Cluster, busybox_pod, running_cluster
from .test_dra import DRIVER, GROUP, VERSION, custom

pytestmark = pytest.mark.cluster

GPUS = 2
NODE = "gpu-node-0"  # the one node, a real one
CHOICE = "gpupool.io/choice"  # the extender's bind: {"node": ..., "gpus": {container: [uuid, ...]}}
POD_UID_IN_CGROUP = re.compile(r"/kubepods/[a-z]+/pod([0-9a-f-]{36})/")


@pytest.fixture(scope="module")
def real() -> Iterator[Cluster]:
    from tools.kube_cluster import kubelet_node

    why = kubelet_node.missing_parts()
    if why:
        pytest.skip(f"no real kubelet node here: {why}")
    with running_cluster(1, GPUS, real_nodes=1) as started:
        yield started


def python_pod(name: str, code: str, limits: Dict[str, str]) -> Dict[str, Any]:
    """A pod whose container runs `python3 -c code` asking a GPU share in `limits`; its python is the
    node's own (/usr, /lib and /lib64 mounted read-only), as no Python image can be pulled here."""
    pod = busybox_pod(name, "", restartPolicy="Never")
    container = pod["spec"]["containers"][0]
    container.update(name="train", command=["python3", "-c", code], resources={"limits": limits})
    host = ("/usr", "/lib", "/lib64")
    container["volumeMounts"] = [{"name": p.strip("/"), "mountPath": p, "readOnly": True} for p in host]
    pod["spec"]["volumes"] = [{"name": p.strip("/"), "hostPath": {"path": p}} for p in host]
    return pod


def logs(real: Cluster, ns: str, name: str, container: str = "") -> str:
    """The container's log, which the API server fetches from the kubelet ('' while it has none)."""
    done = real.kubectl("logs", "-n", ns, name, *(["-c", container] if container else []))
    return str(done.stdout) if done.returncode == 0 else ""


def explain(real: Cluster, ns: str, name: str) -> str:
    """What the cluster says of a pod that did not get where a test waited: its status, events and logs."""
    status = json.dumps(real.pod(ns, name)["status"], default=str)
    events = [f"{e['reason']}: {e['message']}" for e in real.events(ns, name)]
    return f"status {status}\nevents {events}\nlog {real.kubectl('logs', '-n', ns, name, '--all-containers').stdout}"


def phase(real: Cluster, ns: str, name: str) -> str:
    return str(real.pod(ns, name)["status"].get("phase"))


def agent(real: Cluster, token: str = "") -> HttpPoolClient:
    """A client of the node's agent with `token` (default: the agents' admin token)."""
    side = real.side
    token = token or side.agent_token_file.read_text().strip()
    return HttpPoolClient(side.agent_url(0), token, str(side.tls / "agent-ca.crt"))


def leases(real: Cluster) -> Dict[str, str]:
    """The node agent's live leases: id -> holder label."""
    client = agent(real)
    try:
        return {lease.id: lease.holder.label for lease in client.status().leases}
    finally:
        client.close()


def gpu_namespace(real: Cluster) -> str:
    """A namespace whose pods' runners hold a user token of the node agents (`gpupool kube secret`'s
    two halves: the token in the agents' tokens folder, the namespace's gpupool-client Secret)."""
    ns = real.namespace("share")
    token = uuid.uuid4().hex
    (real.side.state / "tokens" / ns).write_text(token)
    ca = (real.side.tls / "agent-ca.crt").read_text()
    secret = {"metadata": {"name": "gpupool-client"}, "stringData": {"token": token, "ca.crt": ca}}
    real.core.create_namespaced_secret(ns, secret)
    # The agent reads its tokens folder every 30 s, as a Secret volume changes under it.
    wait_until(lambda: accepts(real, token), 60, "the node agent to take the namespace's token")
    return ns


def accepts(real: Cluster, token: str) -> bool:
    client = agent(real, token)
    try:
        client.status()
    except Unauthorized:  # until the agent has read the token
        return False
    finally:
        client.close()
    return True


def test_the_kubelet_registers_its_node_with_the_device_plugins_gpus(real):
    node = real.json(real.core.read_node(NODE))
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://")
    # The kubelet's own count of what the device plugin's ListAndWatch reports healthy.
    wait_until(
        lambda: real.json(real.core.read_node(NODE))["status"]["allocatable"].get(UNITS) == str(GPUS * UNITS_PER_GPU),
        60,
        "the kubelet to publish the device plugin's units",
    )
    slices = custom(real).list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]
    assert [s["spec"]["nodeName"] for s in slices if s["spec"]["driver"] == DRIVER] == [NODE]


def test_a_pod_runs_below_kubepods_and_its_log_comes_from_the_kubelet(real):
    ns = real.namespace("plain")
    real.create_pod(ns, busybox_pod("hello", "grep pids /proc/self/cgroup; sleep 3600"))
    wait_until(lambda: POD_UID_IN_CGROUP.search(logs(real, ns, "hello")), 120, "the pod's log")
    uid = real.pod(ns, "hello")["metadata"]["uid"]
    assert POD_UID_IN_CGROUP.search(logs(real, ns, "hello")).group(1) == uid  # type: ignore[union-attr]
    assert phase(real, ns, "hello") == "Running"


def test_a_gpu_pod_runs_under_its_runner_on_the_gpu_the_extender_chose(real):
    ns = gpu_namespace(real)
    code = "import json, os, time; print(json.dumps(dict(os.environ)), flush=True); time.sleep(3600)"
    real.create_pod(ns, python_pod("share", code, {"gpupool.io/gpu-percent": "50"}))

    def env() -> Dict[str, str]:
        lines = [line for line in logs(real, ns, "share", "train").splitlines() if line.startswith("{")]
        return dict(json.loads(lines[0])) if lines else {}

    wait_until(env, 180, "the command to run under the runner", detail=lambda: explain(real, ns, "share"))
    pod = real.pod(ns, "share")
    seen = env()
    chosen = json.loads(pod["metadata"]["annotations"][CHOICE])
    assert chosen["node"] == NODE
    # Allocate's answer (the device plugin, called by the kubelet) and the runner's pin agree with
    # the extender's bind.
    assert seen[UNITS_ENV] == str(UNITS_PER_GPU // 2)
    assert seen[ALLOCATED_GPUS_ENV].split(",") == chosen["gpus"]["train"]
    assert seen["CUDA_VISIBLE_DEVICES"] == seen[ALLOCATED_GPUS_ENV]
    # The webhook's init container ran on the kubelet and put the runner in place.
    init = pod["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["exitCode"] == 0
    lease_id = seen["GPUPOOL_LEASE_ID"]
    assert leases(real)[lease_id] == f"pod:{ns}/share:{pod['metadata']['uid']}"
    # The runner attested from inside the pod: the pid the agent took from SO_PEERCRED lies, by the
    # kernel's word, in this pod's cgroup.
    agent_log = (real.side.state / "logs" / f"agent-{NODE}.log").read_text()
    pid = int(re.findall(rf"lease {lease_id} attested by pid (\d+)", agent_log)[-1])
    cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    assert POD_UID_IN_CGROUP.search(cgroup).group(1) == pod["metadata"]["uid"]  # type: ignore[union-attr]

    # Deleted: the kubelet stops the container, the runner ends and its lease is released.
    real.core.delete_namespaced_pod("share", ns)
    wait_until(lambda: lease_id not in leases(real), 60, "the deleted pod's lease to be released")


def resource_claim(name: str, memory: str) -> Dict[str, Any]:
    exactly = {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def cdi_specs(real: Cluster) -> List[str]:
    return sorted(p.name for p in (real.side.node_dir(0) / "cdi").glob("*.json"))


def test_the_kubelet_prepares_a_dra_claim_for_its_pod_and_unprepares_it_after(real):
    ns = real.namespace("dra")
    custom(real).create_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims", resource_claim("half", "40Gi"))
    pod = busybox_pod("dra", "sleep 3600")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "half"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    real.create_pod(ns, pod)
    # The kubelet starts the container only once NodePrepareResources succeeded.
    wait_until(lambda: phase(real, ns, "dra") == "Running", 120, "the DRA pod to run")
    claim = custom(real).get_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims", "half")
    uid = claim["metadata"]["uid"]
    held = [label for label in leases(real).values() if label == f"dra-claim:{ns}/half:{uid}"]
    assert len(held) == 1
    assert any(uid in name for name in cdi_specs(real))

    real.core.delete_namespaced_pod("dra", ns)
    wait_until(lambda: f"dra-claim:{ns}/half:{uid}" not in leases(real).values(), 60, "NodeUnprepareResources")
    assert not any(uid in name for name in cdi_specs(real))
