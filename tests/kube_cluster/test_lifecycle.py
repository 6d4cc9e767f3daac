"""Everything gpupool's side starts ends with what started it: a process that brought a cluster up
(`gpupool_side.bring_up`, as the `cluster` fixture does) killed with -9 takes the webhook, the
node agents and the control plane with it (the kernel's parent-death signal), and a real node's
kubelet, containerd and running containers (its pid namespace ends with it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

import pytest
from waiting import wait_until

from .cluster_fixture import ROOT, busybox_pod, controlplane

pytestmark = pytest.mark.cluster

STARTER = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from tools.kube_cluster import controlplane, gpupool_side
state = Path({state!r})
plane = controlplane.ControlPlane(state, controlplane.build())
gpupool_side.bring_up(plane, state, nodes=1, gpus=1, real_nodes={real_nodes})
print("up", flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def in_kubepods() -> List[int]:
    """Pids of the processes in a pod's cgroup (a container's) on this machine now."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if "/kubepods/" in (entry / "cgroup").read_text():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("real_nodes", [0, 1], ids=["kwok", "real-kubelet"])
def test_kill_9_of_the_starter_ends_every_process_it_started(real_nodes):
    try:
        controlplane.build(["kubelet"] if real_nodes else [])
    except controlplane.GoMissing as err:
        pytest.skip(f"no control plane here: {err}")
    if real_nodes:
        from tools.kube_cluster import kubelet_node

        why = kubelet_node.missing_parts()
        if why:
            pytest.skip(f"no real kubelet node here: {why}")
    state = Path(tempfile.mkdtemp(prefix="gpk-"))
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER.format(root=str(ROOT), state=str(state), real_nodes=real_nodes)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert starter.stdout is not None
        said = []
        for line in starter.stdout:  # until it says it is up, or ends
            said.append(line)
            if line.strip() == "up":
                break
        assert said and said[-1].strip() == "up", "".join(said)
        pids = {p.stem: int(p.read_text().split()[0]) for p in (state / "pids").glob("*.pid")}
        assert {"gpupool-webhook", "gpupool-agent-gpu-node-0", "kube-apiserver", "etcd"} <= set(pids)
        assert all(alive(pid) for pid in pids.values())
        if real_nodes:  # a container running on the real node when its starter dies
            run_pod(state)
            wait_until(in_kubepods, 120, "the pod's container to run")
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(10)
        wait_until(lambda: not any(alive(pid) for pid in pids.values()), 30, "every process started to end")
        wait_until(lambda: not in_kubepods(), 30, "every container to end")
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(10)
        if real_nodes:
            from tools.kube_cluster import kubelet_node

            kubelet_node.clean_up(0)
        shutil.rmtree(state, ignore_errors=True)


def run_pod(state: Path) -> None:
    pod = busybox_pod("sleeper", "sleep 3600")
    kubectl = controlplane.build() / "kubectl"
    subprocess.run(
        [str(kubectl), "--kubeconfig", str(state / "admin.kubeconfig"), "create", "-f", "-"],
        input=json.dumps(pod),
        text=True,
        check=True,
        capture_output=True,
        timeout=60,
    )
