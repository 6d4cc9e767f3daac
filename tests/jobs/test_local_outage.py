"""Issue 23 (3): a local job queued on a pool server keeps its place through a kill -9 and restart
of the server, and runs once the GPUs are free (before, its claim died with the connection)."""

from __future__ import annotations

import signal

import httpx
import pytest
from conftest import start_server
from envs import quiet_port

pytestmark = pytest.mark.slow


def test_a_queued_job_outlives_a_restart_of_the_server(shell, tmp_path):
    port = quiet_port()
    server = start_server(tmp_path / "server-state", "--ttl", "30", "--listen", f"127.0.0.1:{port}")
    try:
        body = {"claim": {"requests": [{"count": 2, "fraction": 1.0}]}, "holder": {"name": "full"}, "ttl_s": 600}
        full = httpx.post(server.url + "/v1/leases", json=body, headers=server.headers(), timeout=10).json()["id"]
        shell.env["GPUPOOL_TOKEN"] = server.token or ""
        job = {
            "name": "queued",
            "roles": {"worker": {"replicas": 1, "command": ["true"], "gpu": {"count": 1, "fraction": 1.0}}},
        }
        shell.run("submit", "--server", server.url, shell.write_spec(job))
        shell.wait_for("queued", lambda s: s["status"] == "Queued")
        server.stop(signal.SIGKILL)
        server = start_server(server.state, "--ttl", "30", "--listen", f"127.0.0.1:{port}")
        r = httpx.delete(f"{server.url}/v1/leases/{full}", headers=server.headers(), timeout=10)
        assert r.status_code == 200, r.text
        state = shell.wait_for("queued", lambda s: s["status"] in ("Succeeded", "Failed"))
        assert state["status"] == "Succeeded", state
    finally:
        server.stop(signal.SIGKILL)
