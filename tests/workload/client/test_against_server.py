"""The workload side against a real `gpupool server` (tests/conftest.py): HTTP, TLS, tokens, several servers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from envs import clean_env, free_port
from gpupool_cli import gpupool

from gpupool.core.errors import Unauthorized
from gpupool.core.model import Claim, Holder
from gpupool.workload.client.config import write_client_bundle
from gpupool.workload.client.http import HttpPoolClient

pytest.importorskip("fastapi")
pytest.importorskip("httpx")


def workload_env(tmp_path: Path, **extra: str) -> dict:
    """A clean env with no embedded pool of its own: the server is the only pool."""
    return clean_env(tmp_path, GPUPOOL_STATE=str(tmp_path / "no-embedded"), **extra)


def test_run_over_http_with_token_env(running_server, tmp_path):
    env = workload_env(tmp_path, GPUPOOL_TOKEN=running_server.token)
    record = tmp_path / "env.txt"
    done = gpupool(
        "run",
        "--server",
        running_server.url,
        "-n",
        "2",
        "-m",
        "4GiB",
        "--ttl",
        "5",
        "--",
        sys.executable,
        "-c",
        f"import os,time; open({str(record)!r},'w').write(os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(7)",
        env=env,
        module="gpupool.cli.workload",
    )
    assert done.returncode == 0, done.stderr
    assert len(record.read_text().split(",")) == 2
    assert f"Choosing GPUs from server list [{running_server.url}]" in done.stderr
    assert "LOST" not in done.stderr  # heartbeats over HTTP kept the 5 s lease past its TTL
    status = gpupool("status", "--json", "--server", running_server.url, env=env, module="gpupool.cli.workload")
    assert json.loads(status.stdout)["leases"] == []


@pytest.mark.parametrize("token, hint", [(None, "no token was sent"), ("gp_wrong_token_123456", "refused")])
def test_missing_or_wrong_token_exits_10(running_server, tmp_path, token, hint):
    env = workload_env(tmp_path, **({"GPUPOOL_TOKEN": token} if token else {}))
    done = gpupool(
        "run", "--server", running_server.url, "-p", "0.5", "--", "true", env=env, module="gpupool.cli.workload"
    )
    assert done.returncode == Unauthorized.exit_code == 10  # a refused token, not a usage error
    assert hint in done.stderr and "Traceback" not in done.stderr


def test_tls_with_the_client_bundle(server_factory, tmp_path):
    server = server_factory("--tls", "auto")
    ca = (server.state / "tls" / "ca.crt").read_text()
    write_client_bundle(tmp_path / "bundle", [server.url], server.token, ca)
    env = workload_env(tmp_path, GPUPOOL_CONFIG=str(tmp_path / "bundle" / "client.yaml"))
    done = gpupool(
        "run", "-p", "0.5", "--", "sh", "-c", 'test -n "$CUDA_VISIBLE_DEVICES"', env=env, module="gpupool.cli.workload"
    )
    assert done.returncode == 0, done.stderr
    assert server.url in done.stderr
    # Without the CA the same server is refused, with the fix in the message.
    env_no_ca = workload_env(tmp_path, GPUPOOL_TOKEN=server.token)
    refused = gpupool("status", "--server", server.url, env=env_no_ca, module="gpupool.cli.workload")
    assert refused.returncode == 5 and "ca.crt" in refused.stderr


def test_several_servers_skip_dead_and_full_ones(server_factory, tmp_path):
    full = server_factory("--devices", "emulated:1x16GiB")
    free = server_factory("--devices", "emulated:1x16GiB")
    HttpPoolClient(full.url, token=full.token).claim(Claim.single(1, fraction=1.0), Holder("hog"), ttl_s=60)
    # The two servers have different admin tokens: give each its own through a config file.
    config = tmp_path / "cfg" / "client.yaml"
    config.parent.mkdir()
    config.write_text(
        json.dumps(
            {
                "servers": [
                    {"url": f"http://127.0.0.1:{free_port()}"},
                    {"url": full.url, "token": full.token},
                    {"url": free.url, "token": free.token},
                ]
            }
        )
    )
    env = workload_env(tmp_path, GPUPOOL_CONFIG=str(config))
    done = gpupool("run", "-p", "0.5", "--", "true", env=env, module="gpupool.cli.workload")
    assert done.returncode == 0, done.stderr
    assert "warning: skipping http://127.0.0.1" in done.stderr
    assert f"on {free.url} as lease" in done.stderr
    pinned = gpupool(
        "run", "-p", "0.5", "--filter", f"server.addr={full.url}", "--", "true", env=env, module="gpupool.cli.workload"
    )
    assert pinned.returncode == 3 and "--wait" in pinned.stderr
    status = json.loads(gpupool("status", "--json", env=env, module="gpupool.cli.workload").stdout)
    assert len(status["devices"]) == 2 and len(status["leases"]) == 1
