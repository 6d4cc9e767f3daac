"""`gpupool kube ...` bad input: a clear message and exit 2, never a traceback."""

from __future__ import annotations

import pytest
from envs import clean_env
from gpupool_cli import gpupool


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
    done = gpupool("kube", *args, env=clean_env(drop="KUBERNETES_"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
