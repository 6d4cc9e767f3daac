"""`gpupool run` attests its lease to the node: real server, real runner, the emulated usage file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

import httpx
from waiting import wait_until

from gpupool.core.attestation import SOCKET_ENV, TICKET_FIELD
from gpupool.devices.usage import EMULATED_USAGE_ENV

CLI = [sys.executable, "-m", "gpupool.cli.workload"]
HOLDER = str(Path(__file__).resolve().parent / "holder.py")


def write_usage(path: Path, usage: Dict[str, Dict[str, int]]) -> None:
    path.with_suffix(".tmp").write_text(json.dumps(usage))
    os.replace(path.with_suffix(".tmp"), path)


def owners(server, started: float) -> Dict[int, str]:
    """pid -> lease id of the first usage sample taken after `started`."""

    def fresh() -> object:
        usage = httpx.get(f"{server.url}/v1/status", headers=server.headers()).json().get("usage") or {}
        return usage if usage.get("sampled_at", 0) > started else None

    usage = wait_until(fresh, 10, "a fresh usage sample")
    return {p["pid"]: p["lease_id"] for p in usage["processes"]}  # type: ignore[index]


def test_the_key_is_in_the_claims_answer_only(running_server):
    s = running_server
    answer = httpx.post(
        f"{s.url}/v1/leases", json={"claim": {"requests": [{"count": 1, "fraction": 0.5}]}}, headers=s.headers()
    )
    assert answer.status_code == 201
    ticket = answer.json()[TICKET_FIELD]
    assert len(ticket["key"]) == 64 and ticket["socket"] == str(s.state.resolve() / "attest" / "attest.sock")
    lease_id = answer.json()["id"]
    for path in (f"/v1/leases/{lease_id}", "/v1/leases", "/v1/status", f"/v1/leases/{lease_id}/heartbeat"):
        call = httpx.post if path.endswith("heartbeat") else httpx.get
        body = call(f"{s.url}{path}", headers=s.headers()).text
        assert ticket["key"] not in body and TICKET_FIELD not in json.loads(body), path


def test_a_run_that_cannot_attest_warns_once_and_runs(running_server, tmp_path):
    env = dict(running_server.client_env(tmp_path), **{SOCKET_ENV: str(tmp_path / "nowhere.sock")})
    done = subprocess.run(
        CLI + ["run", "--server", running_server.url, "-p", "0.25", "--", sys.executable, "-c", "print('ran')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr
    warnings = [line for line in done.stderr.splitlines() if "not attested" in line]
    assert len(warnings) == 1 and "cannot attribute this lease's processes" in warnings[0], done.stderr
    assert str(tmp_path / "nowhere.sock") in warnings[0]


def test_an_embedded_run_has_nothing_to_attest(pool, tmp_path):
    done = pool.run("run", "-p", "0.5", "--", sys.executable, "-c", "pass")
    assert done.returncode == 0 and "attest" not in done.stderr, done.stderr


def test_attestations_survive_a_server_kill_9(server_factory, tmp_path, monkeypatch):
    """A restarted server still knows the runners attested before (STATE/attestations.json)."""
    usage = tmp_path / "usage.json"
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(usage))
    flags = ("--usage-interval", "0.2", "--enforce-grace", "30", "--ttl", "30")
    server = server_factory(*flags)
    record, stop = tmp_path / "child.json", tmp_path / "stop"
    runner = subprocess.Popen(
        CLI + ["run", "--server", server.url, "-p", "0.5", "--", sys.executable, HOLDER, str(record), str(stop)],
        env=server.client_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(record.exists, 30, "the command to start")
        child = json.loads(record.read_text())["pid"]
        (lease,) = httpx.get(f"{server.url}/v1/status", headers=server.headers()).json()["leases"]
        write_usage(usage, {lease["devices"][0]["uuid"]: {str(child): 1024}})
        assert owners(server, time.time())[child] == lease["id"]

        server.stop(signal.SIGKILL)
        again = server_factory(*flags, state=server.state)
        assert owners(again, time.time())[child] == lease["id"]
        stop.touch()
        assert runner.wait(timeout=30) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait()


def test_a_busy_node_is_asked_again(running_server, tmp_path):
    """Another caller of the same user holds every slot it may (4): the runner asks again until
    the node cuts those stalled connections (2 s), and attests."""
    import socket

    path = str(running_server.state.resolve() / "attest" / "attest.sock")
    stalled = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(4)]
    try:
        for sock in stalled:
            sock.connect(path)
        started = time.monotonic()
        done = subprocess.run(
            CLI + ["run", "--server", running_server.url, "-p", "0.25", "--", sys.executable, "-c", "pass"],
            env=running_server.client_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and "not attested" not in done.stderr, done.stderr
        assert time.monotonic() - started >= 1.5  # it did wait for the stalled callers to be cut
    finally:
        for sock in stalled:
            sock.close()
