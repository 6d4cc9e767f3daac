"""`gpupool run` attests its lease to the node: real server, real runner, the emulated usage file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import httpx
import pytest
from envs import write_usage
from waiting import wait_until

from gpupool.core.attestation import ATTEST_WAIT_ENV, SOCKET_ENV, TICKET_FIELD
from gpupool.core.errors import NotAttested
from gpupool.pooling.devices.usage import EMULATED_USAGE_ENV

CLI = [sys.executable, "-m", "gpupool.cli.workload"]
HOLDER = str(Path(__file__).resolve().parent / "holder.py")


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


def test_stalled_connections_of_the_same_user_do_not_hold_a_run_up(running_server, tmp_path):
    """Another caller of the same user holds every connection it may (4): the run's own connection
    closes the oldest of them and is served at once; nothing waits for the stalled ones' deadline."""
    import socket

    path = str(running_server.state.resolve() / "attest" / "attest.sock")
    stalled = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(4)]
    try:
        for sock in stalled:
            sock.connect(path)
        done = subprocess.run(
            CLI + ["run", "--server", running_server.url, "-p", "0.25", "--", sys.executable, "-c", "print('ran')"],
            env=running_server.client_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr
        assert "attest" not in done.stderr, done.stderr  # neither "not attested" nor "waiting"
        stalled[0].settimeout(10)
        assert b'"unavailable"' in stalled[0].makefile("rb").readline()
    finally:
        for sock in stalled:
            sock.close()


class FakeNode:
    """A stand-in attestation socket that answers each connection with the next of `answers` (the
    last one again once they run out); None: accept and never answer."""

    def __init__(self, path: Path, answers: List[Optional[dict]]) -> None:
        import socket
        import threading

        self.path, self.answers, self.calls = path, answers, 0
        self.held: List[object] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            answer = self.answers[min(self.calls, len(self.answers) - 1)]
            self.calls += 1
            if answer is None:
                self.held.append(conn)
                continue
            with conn:
                conn.makefile("rb").readline()
                conn.sendall(json.dumps(answer).encode() + b"\n")

    def close(self) -> None:
        import socket

        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self.held:
            conn.close()  # type: ignore[attr-defined]


BUSY = {"error": {"code": "unavailable", "message": "at most 4 attestations of one user are open at once"}}
REFUSED = {"error": {"code": "forbidden", "message": "the key is not lease 'x''s"}}


def run_marking(server, tmp_path: Path, node: Path, **env: str) -> Tuple[subprocess.CompletedProcess, Path]:
    """`gpupool run` of a command that leaves a mark, attesting on `node`."""
    mark = tmp_path / "ran"
    done = subprocess.run(
        CLI + ["run", "--server", server.url, "-p", "0.25", "--", sys.executable, "-c", f"open({str(mark)!r}, 'w')"],
        env=dict(server.client_env(tmp_path), **{SOCKET_ENV: str(node)}, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, mark


def leases(server) -> list:
    return httpx.get(f"{server.url}/v1/status", headers=server.headers()).json()["leases"]


def test_a_run_the_node_refuses_does_not_start_its_command(running_server, tmp_path):
    node = FakeNode(tmp_path / "node.sock", [REFUSED])
    try:
        done, mark = run_marking(running_server, tmp_path, node.path)
    finally:
        node.close()
    assert done.returncode == NotAttested.exit_code == 9, done.stderr
    assert not mark.exists(), "the command ran unattested"
    assert leases(running_server) == []  # released at once, not left to its TTL
    errors = [line for line in done.stderr.splitlines() if line.startswith("gpupool: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "was not attested to the pool's node (the key is not lease 'x''s)" in errors[0]
    assert "the command was not started" in errors[0] and node.calls == 1


@pytest.mark.parametrize("kind", ["busy", "silent", "down"])
def test_a_node_that_cannot_answer_is_waited_for_then_the_command_is_not_started(running_server, tmp_path, kind):
    """A node that stays busy, never answers, or is down (its socket there, nobody listening): the run
    says once that it waits, asks again for GPUPOOL_ATTEST_WAIT seconds, then fails closed."""
    import socket

    path, node, stale = tmp_path / "node.sock", None, None
    if kind == "down":
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(path))  # bound, never listening: connect() is refused
    else:
        node = FakeNode(path, [BUSY if kind == "busy" else None])
    try:
        done, mark = run_marking(running_server, tmp_path, path, **{ATTEST_WAIT_ENV: "3"})
    finally:
        if node is not None:
            node.close()
        if stale is not None:
            stale.close()
    assert done.returncode == 9, done.stderr
    assert not mark.exists(), "the command ran unattested"
    assert leases(running_server) == []
    waits = [line for line in done.stderr.splitlines() if "waiting up to 3s for the pool's node" in line]
    assert len(waits) == 1, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("gpupool: error:")]
    assert "could not be attested to the pool's node within 3s" in error and ATTEST_WAIT_ENV in error
    if node is not None:
        assert node.calls >= 2, "it asked again"


def test_a_busy_node_is_waited_for_and_then_the_command_starts(running_server, tmp_path):
    node = FakeNode(tmp_path / "node.sock", [BUSY, BUSY, {"attested": {"lease_id": "x", "pid": 1}}])
    try:
        done, mark = run_marking(running_server, tmp_path, node.path)
    finally:
        node.close()
    assert done.returncode == 0 and mark.exists(), done.stderr
    assert node.calls == 3
    waits = [line for line in done.stderr.splitlines() if "waiting up to 30s" in line]
    assert len(waits) == 1 and "at most 4 attestations of one user" in waits[0], done.stderr


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "1e9"])
def test_a_bad_attest_wait_is_named_and_nothing_runs(running_server, tmp_path, value):
    node = FakeNode(tmp_path / "node.sock", [BUSY])
    try:
        done, mark = run_marking(running_server, tmp_path, node.path, **{ATTEST_WAIT_ENV: value})
    finally:
        node.close()
    assert done.returncode == 2 and not mark.exists(), done.stderr
    assert f"{ATTEST_WAIT_ENV}={value!r} is not a number of seconds" in done.stderr
    assert "Traceback" not in done.stderr and leases(running_server) == []
