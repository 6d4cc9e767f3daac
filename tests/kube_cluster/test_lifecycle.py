"""Everything gpupool's side starts ends with what started it: a process that brought a cluster up
(`gpupool_side.bring_up`, as the `cluster` fixture does) killed with -9 takes the webhook, the
node agents and the control plane with it (the kernel's parent-death signal)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from waiting import wait_until

from .cluster_fixture import ROOT, controlplane

pytestmark = pytest.mark.cluster

STARTER = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from tools.kube_cluster import controlplane, gpupool_side
state = Path({state!r})
plane = controlplane.ControlPlane(state, controlplane.build())
gpupool_side.bring_up(plane, state, nodes=1, gpus=1)
print("up", flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_9_of_the_starter_ends_every_process_it_started():
    try:
        controlplane.build()
    except controlplane.GoMissing as err:
        pytest.skip(f"no control plane here: {err}")
    state = Path(tempfile.mkdtemp(prefix="gpk-"))
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER.format(root=str(ROOT), state=str(state))],
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
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(10)
        wait_until(lambda: not any(alive(pid) for pid in pids.values()), 30, "every process started to end")
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(10)
        shutil.rmtree(state, ignore_errors=True)
