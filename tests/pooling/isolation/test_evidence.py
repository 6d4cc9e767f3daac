"""isolation/evidence: what the node itself knows about a process (SO_PEERCRED, start time, kubepods cgroup)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

from gpupool.pooling.isolation.evidence import (
    NodeView,
    kube_pod_uid,
    peer_credentials,
    start_ticks,
    uptime_ticks,
    witness_peer,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")

UID = "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e"
SLICE_UID = UID.replace("-", "_")
CID = "0123456789abcdef" * 4


def fake_cgroup(tmp_path: Path, pid: int, text: str) -> str:
    folder = tmp_path / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "cgroup").write_text(text)
    return str(tmp_path / "proc")


@pytest.mark.parametrize(
    "cgroup",
    [
        # cgroup v1, cgroupfs driver
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n",
        f"4:pids:/kubepods/pod{UID}/{CID}\n",
        # cgroup v1, systemd driver
        f"10:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SLICE_UID}.slice"
        f"/cri-containerd-{CID}.scope\n",
        # cgroup v2, systemd driver (guaranteed QoS has no QoS slice)
        f"0::/kubepods.slice/kubepods-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope\n",
        # read from the agent's own cgroup namespace: the kubelet's tree seen through ".."
        f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope\n",
    ],
)
def test_a_pod_uid_counts_below_kubepods(tmp_path, cgroup):
    assert kube_pod_uid(7, proc_root=fake_cgroup(tmp_path, 7, cgroup)) == UID


def test_a_static_pod_uid_is_a_32_hex_hash(tmp_path):
    cgroup = f"0::/kubepods/besteffort/pod{'ab' * 16}/{CID}\n"
    assert kube_pod_uid(10, proc_root=fake_cgroup(tmp_path, 10, cgroup)) == "ab" * 16


@pytest.mark.parametrize(
    "cgroup",
    [
        # a user's delegated subtree can hold a cgroup named after any pod: not the kubelet's
        f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/pod{SLICE_UID}.slice\n",
        f"0::/user.slice/user-1000.slice/user@1000.service/kubepods/pod{UID}/x\n",
        "0::/\n",  # inside a cgroup namespace: nothing to see
        "0::/user.slice/user-1000.slice/session-2.scope\n",
        "1:name=systemd:/system.slice/podman.service\n",  # "pod" as part of a word
        # a kubelet nested in a container (kind, docker-in-docker): the node's first component is not kubepods
        f"0::/docker/{CID}/kubepods/burstable/pod{UID}/{CID}\n",
        "garbage\n",
    ],
)
def test_a_pod_uid_outside_kubepods_is_not_evidence(tmp_path, cgroup):
    assert kube_pod_uid(8, proc_root=fake_cgroup(tmp_path, 8, cgroup)) is None
    assert kube_pod_uid(9, proc_root=str(tmp_path / "proc")) is None  # no such process


def test_the_kernel_names_the_peer_and_its_start_time():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert peer_credentials(left)[:2] == (os.getpid(), os.getuid())
        witness = witness_peer(left, uptime_ticks())
        assert witness is not None and (witness.pid, witness.uid) == (os.getpid(), os.getuid())
        assert witness.start_ticks == start_ticks(os.getpid())
        # A peer that started after the connection was accepted is a reused pid, not the peer.
        assert witness_peer(left, witness.start_ticks - 1) is None


@pytest.mark.parametrize("uptime", ["10395.05", "10395.04", "0.29", "123.00"])
def test_uptime_ticks_read_the_decimal_exactly(tmp_path, uptime):
    # float("10395.05") * 100 truncates to 1039504: a process started in that tick looked
    # born after "now" and failed attestation's reused-pid check.
    (tmp_path / "uptime").write_text(f"{uptime} 99.00\n")
    whole, cents = uptime.split(".")
    expected = (int(whole) * 100 + int(cents)) * os.sysconf("SC_CLK_TCK") // 100
    assert uptime_ticks(str(tmp_path)) == expected


def test_start_ticks_change_with_the_process_behind_a_pid():
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    # the clock a tick past the first's start, so the second starts on a later tick (the thing compared)
    wait_until(lambda: (uptime_ticks() or 0) > (start_ticks(first.pid) or 0), 10, "a clock tick past the first's start")
    second = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        a, b = start_ticks(first.pid), start_ticks(second.pid)
        assert a is not None and b is not None and a < b <= (uptime_ticks() or 0)
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
    assert start_ticks(first.pid) is None


def test_lineage_walks_up_to_init():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        chain = list(NodeView().lineage(child.pid))
        assert chain[:2] == [child.pid, os.getpid()] and len(chain) == len(set(chain))
    finally:
        child.kill()
        child.wait()
