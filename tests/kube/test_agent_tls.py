"""The node agent over HTTPS, as deploy/ runs it: a certificate for its node issued at start from
the agents' CA; the runner in a pod, the webhook and the extender verify it; bearer tokens never
cross a network in clear text (plain HTTP only on loopback)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from waiting import tail, wait_until

from gpupool.cli.main import main
from gpupool.kube.mutate import MutateConfig, mutate

from .test_agent_process import POD_UID, USER_TOKEN, pyz, start_agent  # noqa: F401 - pyz is a fixture


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """What deploy/certs.sh writes: the webhook's CA and certificate, and the agents' CA."""
    out = tmp_path_factory.mktemp("tls")
    assert main(["kube", "certs", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory, pki):
    base = tmp_path_factory.mktemp("tls-node")
    agent = start_agent(
        base,
        "--tls-ca-cert",
        str(pki / "agent-ca.crt"),
        "--tls-ca-key",
        str(pki / "agent-ca.key"),
        ca=str(pki / "agent-ca.crt"),
    )
    yield agent
    agent.stop()


def test_agent_serves_https_with_a_certificate_from_the_agents_ca(tls_agent, pki):
    assert tls_agent.url.startswith("https://127.0.0.1:")
    assert tls_agent.get("/healthz") == {"status": "ok"}  # verified against agent-ca.crt, host 127.0.0.1
    assert [d["memory_mib"] for d in tls_agent.status()["devices"]] == [16384, 16384]
    # The webhook's CA does not vouch for agents: the two trust domains are apart.
    import ssl

    webhook_ca = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(tls_agent.url + "/healthz", timeout=5, context=webhook_ca)


def test_runner_in_a_pod_claims_over_verified_https(tls_agent, pki, pyz, tmp_path):  # noqa: F811
    """The env the webhook gives a GPU container with --agent-ca: GPUPOOL_SERVER https, GPUPOOL_CA."""
    env_of = {
        e["name"]: e.get("value")
        for e in _mutated_env(MutateConfig(agent_scheme="https", agent_port=int(tls_agent.url.rsplit(":", 1)[1])))
    }
    assert env_of["GPUPOOL_SERVER"].startswith("https://$(GPUPOOL_NODE_IP):")
    assert env_of["GPUPOOL_CA"] == "/etc/gpupool/ca.crt"  # the gpupool-client Secret's ca.crt
    python = shutil.which("python3") or sys.executable
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GPUPOOL_TOKEN": USER_TOKEN,
        "GPUPOOL_POD_UID": POD_UID,
        "GPUPOOL_CA": str(pki / "agent-ca.crt"),
    }
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    run = [python, str(pyz), "run", "-n", "1", "-p", "0.5", "--server", tls_agent.url, "--", python, "-c", code]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() in {d["uuid"] for d in tls_agent.status()["devices"]}
    # Without the CA, the runner refuses the agent rather than send its token to an unverified peer.
    env.pop("GPUPOOL_CA")
    refused = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert refused.returncode != 0 and "certificate" in (refused.stdout + refused.stderr).lower()


def test_webhook_reaches_agents_over_https(tls_agent, pki, tmp_path):
    token_file = tls_agent.log.parent / "admin-token"
    log = tmp_path / "webhook.log"
    args = [sys.executable, "-m", "gpupool", "kube", "webhook", "--listen", "127.0.0.1:0"]
    args += ["--tls-cert", str(pki / "tls.crt"), "--tls-key", str(pki / "tls.key")]
    args += ["--agents", f"node-a={tls_agent.url}", "--agent-token-file", str(token_file)]
    args += ["--agent-ca", str(pki / "agent-ca.crt"), "--refresh", "0.2"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = wait_until(
            lambda: proc.poll() is None and re.search(r"listening on (https://\S+)", log.read_text()),
            20,
            "the webhook to listen",
            detail=lambda: tail(log),
        ).group(1)
        import ssl

        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.check_hostname = False  # the webhook's certificate names its Service, not 127.0.0.1

        def healthz():
            with urllib.request.urlopen(url + "/healthz", timeout=5, context=ctx) as resp:
                return json.loads(resp.read())

        wait_until(
            lambda: healthz() == {"status": "ok", "nodes": 1},
            10,
            "the webhook to read the agent over HTTPS",
            detail=lambda: tail(log),
        )
    finally:
        proc.terminate()
        proc.wait(10)


def test_plain_http_is_refused_off_loopback(tmp_path, capsys):
    code = main(
        [
            "kube",
            "agent",
            "--listen",
            "0.0.0.0:0",
            "--devices",
            "emulated:1x16GiB",
            "--state",
            str(tmp_path),
            "--no-reap",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "HTTPS only" in err and "--tls-ca-cert" in err and "127.0.0.1" in err
    half = ["kube", "agent", "--listen", "127.0.0.1:0", "--tls-ca-cert", "x.crt", "--state", str(tmp_path)]
    assert main(half) == 2 and "--tls-ca-key" in capsys.readouterr().err


def test_secret_command_puts_the_agents_ca_in_the_client_secret(pki, capsys):
    assert (
        main(
            [
                "kube",
                "secret",
                "team-a",
                "--namespace",
                "team-a",
                "--token",
                "t" * 20,
                "--agent-ca",
                str(pki / "agent-ca.crt"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"--from-file=ca.crt={pki / 'agent-ca.crt'}" in out


def _mutated_env(config: MutateConfig):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "python:3.11-slim",
                    "command": ["python", "t.py"],
                    "resources": {"limits": {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "50"}},
                }
            ]
        },
    }
    (op,) = [o for o in mutate(pod, config).patch if o["path"] == "/spec/containers/0"]
    return op["value"]["env"]
