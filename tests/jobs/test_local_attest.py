"""A local job on a pool server: its supervisor attests the gang lease, so the server's watchdog
counts the replicas (its children) against that lease (issue 23 item 1)."""

from __future__ import annotations

import json
import os
import time

import httpx
from waiting import wait_until

from gpupool.pooling.devices.usage import EMULATED_USAGE_ENV

SLEEPER = ["python", "-c", "import time; print('up', flush=True); time.sleep(600)"]


def test_the_supervisor_attests_and_its_replicas_are_attributed(shell, server_factory, tmp_path, monkeypatch):
    usage = tmp_path / "usage.json"
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(usage))
    server = server_factory("--usage-interval", "0.2", "--enforce-grace", "30")
    shell.env.update(GPUPOOL_TOKEN=server.token or "")
    spec = {
        "name": "attested",
        "framework": "pytorch",
        "roles": {"worker": {"replicas": 2, "command": SLEEPER, "gpu": {"count": 1, "fraction": 0.25}}},
    }
    shell.run("submit", "--server", server.url, shell.write_spec(spec))
    state = shell.wait_for("attested", lambda s: all(r.get("pid") for r in s["replicas"].values()), timeout=60)
    pids = [r["pid"] for r in state["replicas"].values()]
    (lease,) = httpx.get(f"{server.url}/v1/status", headers=server.headers()).json()["leases"]
    rows = {}
    for index, pid in enumerate(pids):
        rows.setdefault(lease["devices"][index % len(lease["devices"])]["uuid"], {})[str(pid)] = 512
    tmp = usage.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, usage)
    started = time.time()

    def fresh() -> dict:
        record = httpx.get(f"{server.url}/v1/status", headers=server.headers()).json().get("usage") or {}
        return record if record.get("sampled_at", 0) > started else {}

    record = wait_until(fresh, 30, "a fresh usage sample")
    assert {p["pid"]: p["lease_id"] for p in record["processes"]} == dict.fromkeys(pids, lease["id"])
    assert "not attested" not in (shell.state / "jobs" / "attested" / "logs" / "supervisor.log").read_text()
    shell.run("cancel", "attested")


def test_a_supervisor_the_node_refuses_starts_no_replica(shell, server_factory, tmp_path):
    """Fail closed: a supervisor whose node refuses its attestation ends the job before any replica runs."""
    import socket
    import threading

    from gpupool.core.attestation import SOCKET_ENV

    refusing = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    refusing.bind(str(tmp_path / "node.sock"))
    refusing.listen(4)

    def refuse() -> None:
        while True:
            try:
                conn, _ = refusing.accept()
            except OSError:
                return
            with conn:
                conn.makefile("rb").readline()
                conn.sendall(b'{"error": {"code": "forbidden", "message": "the key is not lease x\'s"}}\n')

    threading.Thread(target=refuse, daemon=True).start()
    server = server_factory()
    shell.env.update(GPUPOOL_TOKEN=server.token or "", **{SOCKET_ENV: str(tmp_path / "node.sock")})
    mark = tmp_path / "ran"
    spec = {
        "name": "refused",
        "framework": "pytorch",
        "roles": {
            "worker": {
                "replicas": 1,
                "command": ["python", "-c", f"open({str(mark)!r}, 'w')"],
                "gpu": {"count": 1, "fraction": 0.25},
            }
        },
    }
    try:
        shell.run("submit", "--server", server.url, shell.write_spec(spec))
        state = shell.wait_for("refused", lambda s: s["status"] == "Failed", timeout=60)
    finally:
        refusing.close()
    assert "was not attested to the pool's node (the key is not lease x's)" in state["message"], state
    assert not mark.exists() and not any(r.get("pid") for r in state["replicas"].values())
    assert httpx.get(f"{server.url}/v1/status", headers=server.headers()).json()["leases"] == []
