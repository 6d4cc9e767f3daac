"""`gpupool kube ...` bad input: a clear message and exit 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def gpupool(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}  # surely outside a cluster
    return subprocess.run(
        [sys.executable, "-m", "gpupool", "kube", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            [
                "webhook",
                "--listen",
                "127.0.0.1:0",
                "--tls-cert",
                "nope.crt",
                "--tls-key",
                "nope.key",
                "--agents",
                "n1=http://x",
            ],
            "--tls-cert 'nope.crt' does not exist: `gpupool kube certs --out DIR`",
        ),
        (["webhook", "--listen", "127.0.0.1:0", "--tls-cert", "nope.crt"], "give both --tls-cert and --tls-key"),
        (["webhook", "--listen", "127.0.0.1:0"], "outside a cluster pass --agents NODE=URL"),
        (
            ["agent", "--kubelet-dir", ".", "--devices", "emulated:1x1GiB", "--listen", "127.0.0.1:0", "--state", "st"],
            "outside a cluster pass --no-reap",
        ),
        (
            ["webhook", "--listen", "127.0.0.1:0", "--kubeconfig", "nope.yaml"],
            "--kubeconfig 'nope.yaml' does not exist",
        ),
        (["agent", "--kubeconfig", "nope.yaml"], "--kubeconfig 'nope.yaml' does not exist"),
        (["certs", "--out", "tls", "--ip", "node-a"], "--ip 'node-a' is not an IP address, e.g. --ip 127.0.0.1"),
        (["scheduler-config", "--cluster-ip", "127.0.0.1", "--port", "70000"], "--port 70000 must be a TCP port"),
    ],
)
def test_bad_input_exits_2_with_the_fix(args, message, tmp_path):
    done = gpupool(*args, tmp_path=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
