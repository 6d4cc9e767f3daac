"""Issue 23 item 1, end to end: a second token holder spoofs every holder field of its claims and
the watchdog still acts on no process outside that holder's own lease.

A real `gpupool server` with tokens (alice, bob), real `gpupool run`s, the watchdog on the emulated
usage file, and the attestation socket the runners prove their pid on (SO_PEERCRED).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import httpx
import pytest
from envs import write_usage
from waiting import wait_until

from gpupool.pooling.devices.usage import EMULATED_USAGE_ENV
from gpupool.pooling.isolation.proctree import alive
from gpupool.workload.runner.attest import AttestFailed, attest

CLI = [sys.executable, "-m", "gpupool.cli.workload"]
HOLDER = str(Path(__file__).resolve().parents[2] / "workload" / "runner" / "holder.py")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
GRACE_S = 0.5
INTERVAL_S = 0.2
GIB = 1024


@pytest.fixture
def watched(server_factory, tmp_path, monkeypatch):
    """A server with tokens whose watchdog kills over-share leases and only warns about unleased processes."""
    usage = tmp_path / "usage.json"
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(usage))
    server = server_factory("--enforce-grace", str(GRACE_S), "--usage-interval", str(INTERVAL_S), "--enforce", "kill")
    tokens = server.make_tokens("alice", "bob")
    return server, usage, tokens


def start_run(server, tmp_path: Path, token: str, name: str, fraction: str) -> subprocess.Popen:
    env = dict(server.client_env(tmp_path), GPUPOOL_TOKEN=token)
    record, stop = tmp_path / f"{name}.json", tmp_path / f"{name}.stop"
    return subprocess.Popen(
        CLI
        + ["run", "--server", server.url, "-p", fraction, "--ttl", "30", "--", sys.executable, HOLDER]
        + [str(record), str(stop)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def child_of(tmp_path: Path, name: str, runner: subprocess.Popen) -> int:
    record = tmp_path / f"{name}.json"
    wait_until(lambda: record.exists() or runner.poll() is not None, 30, f"{name}'s command to start")
    assert record.exists(), runner.stderr.read() if runner.stderr else runner.returncode
    return int(json.loads(record.read_text())["pid"])


def lease_of(server, token: str, runner_pid: int) -> dict:
    leases = httpx.get(f"{server.url}/v1/status", headers=server.headers()).json()["leases"]
    return next(lease for lease in leases if lease["holder"]["pid"] == runner_pid)


def usage_since(server, started: float) -> dict:
    """The first usage record sampled after `started` (epoch seconds)."""

    def fresh() -> object:
        usage = httpx.get(f"{server.url}/v1/status", headers=server.headers()).json().get("usage") or {}
        return usage if usage.get("sampled_at", 0) > started else None

    return wait_until(fresh, 60, "a fresh usage sample")  # type: ignore[return-value]


def test_spoofed_holder_fields_never_reach_another_lease(watched, tmp_path):
    server, usage, tokens = watched
    alice = start_run(server, tmp_path, tokens["alice"], "alice", "0.5")  # 8 GiB
    bob_run = start_run(server, tmp_path, tokens["bob"], "bob", "0.25")  # 4 GiB, his real job
    bob_shell = subprocess.Popen(SLEEPER)  # a process of Bob's that holds no lease
    stranger = subprocess.Popen(SLEEPER)  # nobody's: no lease at all
    procs: List[subprocess.Popen] = [alice, bob_run, bob_shell, stranger]
    try:
        alice_child, bob_child = child_of(tmp_path, "alice", alice), child_of(tmp_path, "bob", bob_run)
        alice_lease = lease_of(server, tokens["alice"], alice.pid)
        bob_lease = lease_of(server, tokens["bob"], bob_run.pid)
        uuid = alice_lease["devices"][0]["uuid"]
        pod_uid = "0b9d6c2a-7a51-4c4e-9a0c-2f1f7a5d9e11"
        here, elsewhere = socket.gethostname(), "node-elsewhere"
        spoofs = [
            {"pid": 1, "host": here},
            {"pid": bob_shell.pid, "host": here},
            {"pid": alice.pid, "host": here},
            {"pid": alice_child, "host": here},
            {"pid": alice.pid, "host": elsewhere},
            {"pid": os.getpid(), "host": here},  # an ancestor of every process of this test
            {"pid": alice.pid, "host": here, "label": f"pod:ns/alice:{pod_uid}"},
        ]
        bob = {"Authorization": f"Bearer {tokens['bob']}"}
        spoofed = []
        for holder in spoofs:
            body = {"claim": {"requests": [{"count": 1, "memory_mib": 1, "filters": [f"device.uuid={uuid}"]}]}}
            answer = httpx.post(f"{server.url}/v1/leases", json=dict(body, holder=holder), headers=bob)
            assert answer.status_code == 201, answer.text
            spoofed.append(answer.json()["id"])

        # Alice within her 8 GiB; Bob's child within his 4 GiB; Bob's shell and a stranger on the GPU too.
        # Nor can Bob attest Alice's lease: not with his own lease's key, not with a made-up one.
        bob_key = answer.json()["attest"]["key"]
        for key in (bob_key, "0" * 64):
            with pytest.raises(AttestFailed, match="not lease"):
                attest(answer.json()["attest"]["socket"], alice_lease["id"], key)

        started = time.time()
        write_usage(
            usage,
            {uuid: {alice_child: 6 * GIB, bob_child: 2 * GIB, bob_shell.pid: 512, stranger.pid: 256}},
        )
        # Every sample of the next grace periods: no spoofed lease is ever counted anything.
        samples = {}
        # the grace periods' time, and 5 samples at least however slowly a loaded machine takes them
        while time.time() < started + GRACE_S + 8 * INTERVAL_S or len(samples) < 5:
            assert time.time() < started + 120, f"only {len(samples)} fresh usage samples"
            sample = usage_since(server, started)
            samples[sample["sampled_at"]] = sample
            time.sleep(INTERVAL_S / 2)
        for sample in samples.values():
            assert not [p for p in sample["processes"] if p["lease_id"] in spoofed], sample["processes"]
        record = usage_since(server, max(samples))

        owners = {p["pid"]: p["lease_id"] for p in record["processes"]}
        assert owners == {
            alice_child: alice_lease["id"],
            bob_child: bob_lease["id"],
            bob_shell.pid: "",  # a holder pid is a label: Bob's unattested leases own nothing
            stranger.pid: "",
        }
        assert not [a for a in record["actions"] if a["reason"] == "over_share"], record["actions"]
        assert not [a for a in record["actions"] if a["lease_id"] in spoofed], record["actions"]
        # The default --enforce-unleased warn: the two unleased processes are only warned about.
        assert {(a["reason"], a["pid"], a["mode"]) for a in record["actions"]} == {
            ("unleased", bob_shell.pid, "warn"),
            ("unleased", stranger.pid, "warn"),
        }
        assert all(alive(pid) for pid in (alice_child, bob_child, bob_shell.pid, stranger.pid))
        assert alice.poll() is None and bob_run.poll() is None

        # Bob's real job over its share is his to lose, and only his.
        write_usage(usage, {uuid: {alice_child: 6 * GIB, bob_child: 5 * GIB}})
        wait_until(lambda: not alive(bob_child), GRACE_S + 3, "Bob's over-share child to be killed")
        assert bob_run.wait(timeout=10) == 128 + 15
        assert alive(alice_child) and alice.poll() is None
        (tmp_path / "alice.stop").touch()
        assert alice.wait(timeout=20) == 0, alice.stderr.read() if alice.stderr else ""
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
