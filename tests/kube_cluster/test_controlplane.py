"""The local control plane itself (tools/kube_cluster), without gpupool's components: the API
server answers over TLS and authenticates client certificates and service-account tokens, RBAC
decides, resource.k8s.io/v1 is served; kwok's nodes go Ready with gpupool's GPU units; the real
kube-scheduler binds a plain pod that kwok runs; the real Job controller completes a Job and
counts a failed pod; every process ends on stop, on `down`, and with a test run killed by -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.kube_cluster import controlplane, kwok_stages  # noqa: E402

pytestmark = pytest.mark.cluster

NODES, GPUS = 2, 4
WAIT = 120.0  # the machine may be loaded: the conditions are waited for, generously


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    try:
        return controlplane.build()
    except controlplane.GoMissing as err:
        pytest.skip(f"no control plane here: {err}")


@pytest.fixture(scope="module")
def plane(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.ControlPlane]:
    with controlplane.running(tmp_path_factory.mktemp("cp"), bin_dir, nodes=NODES, gpus=GPUS) as cp:
        yield cp


def run_kubectl(cp: controlplane.ControlPlane, *args: str, kubeconfig: Optional[Path] = None, stdin: str = ""):
    """kubectl (v1.37, built with the control plane) as the admin unless `kubeconfig`."""
    config = kubeconfig or cp.admin_kubeconfig
    return subprocess.run(
        [str(cp.kubectl), f"--kubeconfig={config}", *args], input=stdin, capture_output=True, text=True, timeout=120
    )


def kubectl(cp: controlplane.ControlPlane, *args: str, stdin: str = "") -> str:
    """kubectl as the admin; its stdout, which must be a success."""
    done = run_kubectl(cp, *args, stdin=stdin)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def get(cp: controlplane.ControlPlane, *args: str) -> Dict[str, Any]:
    return dict(json.loads(kubectl(cp, "get", "-o", "json", *args)))


def apply(cp: controlplane.ControlPlane, obj: Dict[str, Any]) -> None:
    kubectl(cp, "apply", "-f", "-", stdin=json.dumps(obj))


def job(name: str, namespace: str, annotations: Dict[str, str], backoff: int = 0) -> Dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backoffLimit": backoff,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
                },
            },
        },
    }


def condition(obj: Dict[str, Any], kind: str) -> str:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), "")


def test_the_api_server_is_the_release_over_tls_with_client_certificates(plane):
    version = json.loads(kubectl(plane, "version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"].startswith(controlplane.KUBE_RELEASE)
    assert plane.server.startswith("https://127.0.0.1:")
    # The identity is the certificate's: CN the user, O the groups.
    review = json.loads(kubectl(plane, "auth", "whoami", "-o", "json"))
    assert review["status"]["userInfo"]["username"] == controlplane.ADMIN[0]
    assert "system:masters" in review["status"]["userInfo"]["groups"]


def test_rbac_decides_for_an_unbound_user(plane):
    nobody = plane.kubeconfig_for("nobody-in-particular")
    can = run_kubectl(plane, "auth", "can-i", "list", "pods", "--all-namespaces", kubeconfig=nobody)
    assert (can.returncode, can.stdout.strip()) == (1, "no")
    done = run_kubectl(plane, "get", "pods", "-A", kubeconfig=nobody)
    assert done.returncode != 0
    assert "forbidden" in done.stderr and "nobody-in-particular" in done.stderr
    # Bound to a role, the same certificate may.
    kubectl(plane, "create", "clusterrolebinding", "nobody-views", "--clusterrole=view", "--user=nobody-in-particular")
    wait_until(
        lambda: run_kubectl(plane, "get", "pods", "-A", kubeconfig=nobody).returncode == 0,
        WAIT,
        "the binding in effect",
    )


def test_a_service_account_token_authenticates(plane):
    ns = f"sa-{os.getpid()}"
    kubectl(plane, "create", "namespace", ns)
    kubectl(plane, "-n", ns, "create", "serviceaccount", "probe")
    token = kubectl(plane, "-n", ns, "create", "token", "probe").strip()
    done = subprocess.run(
        [str(plane.kubectl), f"--server={plane.server}", f"--certificate-authority={plane.ca_cert}", f"--token={token}"]
        + ["--kubeconfig=/dev/null", "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:probe"


def test_resource_k8s_io_v1_is_served(plane):
    resources = kubectl(plane, "api-resources", "--api-group=resource.k8s.io", "-o", "name")
    for kind in ("deviceclasses", "resourceclaims", "resourceslices", "resourceclaimtemplates"):
        assert f"{kind}.resource.k8s.io" in resources.split()
    assert "resource.k8s.io/v1" in kubectl(plane, "api-versions").split()


def test_kwok_nodes_are_ready_with_gpupool_units(plane):
    nodes: List[Dict[str, Any]] = get(plane, "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == [controlplane.node_name(i) for i in range(NODES)]
    for index, node in enumerate(sorted(nodes, key=lambda n: n["metadata"]["name"])):
        assert condition(node, "Ready") == "True"
        assert node["status"]["allocatable"]["gpupool.io/gpu"] == str(GPUS * 100)
        assert {"type": "InternalIP", "address": controlplane.node_ip(index)} in node["status"]["addresses"]
    # kwok renews each node's Lease, as a kubelet does (the node lifecycle controller reads it).
    name = nodes[0]["metadata"]["name"]
    first = get(plane, "-n", "kube-node-lease", "lease", name)["spec"]["renewTime"]
    wait_until(
        lambda: get(plane, "-n", "kube-node-lease", "lease", name)["spec"]["renewTime"] != first,
        WAIT,
        f"{name}'s Lease renewed",
        interval=1,
    )


def test_a_plain_pod_is_scheduled_and_runs(plane):
    ns = f"pod-{os.getpid()}"
    kubectl(plane, "create", "namespace", ns)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "100m"}}}]},
    }
    apply(plane, pod)
    running = wait_until(
        lambda: (p := get(plane, "-n", ns, "pod", "web"))["status"].get("phase") == "Running" and p,
        WAIT,
        "the pod Running",
        interval=0.5,
    )
    assert running["spec"]["nodeName"] in {controlplane.node_name(i) for i in range(NODES)}
    assert condition(running, "PodScheduled") == "True"
    events = get(plane, "-n", ns, "events", "--field-selector=involvedObject.name=web")["items"]
    reporters = {
        e.get("reportingComponent") or e.get("source", {}).get("component")
        for e in events
        if e["reason"] == "Scheduled"
    }
    assert reporters == {"default-scheduler"}
    assert running["status"]["podIP"].startswith("10.244.")
    # Deleted: kwok ends it as a kubelet would, and it goes.
    kubectl(plane, "-n", ns, "delete", "pod", "web", "--wait=false")
    wait_until(lambda: not get(plane, "-n", ns, "pods")["items"], WAIT, "the pod gone", interval=0.5)


def test_a_job_completes_through_the_job_controller(plane):
    ns = f"job-{os.getpid()}"
    kubectl(plane, "create", "namespace", ns)
    apply(plane, job("ok", ns, {}))
    done = wait_until(
        lambda: condition(j := get(plane, "-n", ns, "job", "ok"), "Complete") == "True" and j,
        WAIT,
        "the Job Complete",
        interval=0.5,
    )
    assert done["status"]["succeeded"] == 1
    pods = get(plane, "-n", ns, "pods", "-l", "job-name=ok")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]


def test_a_failing_pod_is_retried_by_the_job_controller_until_its_backoff_limit(plane):
    ns = f"fail-{os.getpid()}"
    kubectl(plane, "create", "namespace", ns)
    apply(plane, job("bad", ns, {kwok_stages.FAIL_ANNOTATION: "true"}, backoff=1))
    failed = wait_until(
        lambda: condition(j := get(plane, "-n", ns, "job", "bad"), "Failed") == "True" and j,
        WAIT,
        "the Job Failed",
        interval=0.5,
    )
    assert failed["status"]["failed"] == 2  # the first pod and one retry
    reason = next(c["reason"] for c in failed["status"]["conditions"] if c["type"] == "Failed")
    assert reason == "BackoffLimitExceeded"
    pods = get(plane, "-n", ns, "pods", "-l", "job-name=bad")["items"]
    exits = [c["state"]["terminated"]["exitCode"] for p in pods for c in p["status"]["containerStatuses"]]
    assert exits == [1, 1]


def live(pids: List[int]) -> List[int]:
    """Which of `pids` still run (a zombie does not)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def test_kill_9_of_the_starting_process_ends_etcd_and_the_api_server(bin_dir, tmp_path):
    # A child starts etcd and the API server as the fixture does, prints their pids, then waits.
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from tools.kube_cluster import controlplane
        cp = controlplane.ControlPlane(Path({str(tmp_path / "cp")!r}), Path({str(bin_dir)!r}))
        cp.start_apiserver()
        print(" ".join(str(c.process.pid) for c in cp.components), flush=True)
        time.sleep(3600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) == 2 and live(pids) == pids
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    wait_until(lambda: not live(pids), 30, "etcd and kube-apiserver gone after kill -9 of their starter")


def test_up_prints_the_kubeconfig_and_down_ends_everything(bin_dir, tmp_path):
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tools.kube_cluster"]
    up = subprocess.run(
        [*command, "up", f"--state={state}", "--nodes=1", "--gpus=2", "--control-plane-only"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    pid_files = sorted((state / "pids").glob("*.pid")) if (state / "pids").is_dir() else []
    pids = [int(p.read_text().split()[0]) for p in pid_files]
    try:
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={state / 'admin.kubeconfig'}" in up.stdout.splitlines()
        assert sorted(p.stem for p in pid_files) == sorted(
            ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
        )
        assert live(pids) == pids  # detached: they outlive `up`
        again = subprocess.run([*command, "up", f"--state={state}"], capture_output=True, text=True, cwd=ROOT, env=env)
        assert again.returncode == 2 and "already up" in again.stderr
    finally:
        down = subprocess.run([*command, "down", f"--state={state}"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert down.returncode == 0, down.stderr
    assert not live(pids)
    assert not state.exists()
