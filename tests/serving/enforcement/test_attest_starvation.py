"""Issue 34 item 1: other local users cannot starve attestation and so get a victim's job killed.

Processes under other uids (setuid children, 60001-60005) each keep 6 connections to the node's
attestation socket open without ever sending a line, and connect again whenever one is closed.
Against a real `gpupool server` with tokens and `--enforce-unleased kill`, a `gpupool run` started
meanwhile must still attest, and its job (within its share) must not be killed as a stranger.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List

import httpx
import pytest
from envs import write_usage
from waiting import wait_until

from gpupool.pooling.devices.usage import EMULATED_USAGE_ENV
from gpupool.pooling.isolation.proctree import alive
from gpupool.serving.enforcement.attest import Attestations, AttestKeys, socket_path
from gpupool.serving.enforcement.attest_listener import MAX_CONNECTIONS, AttestListener
from gpupool.workload.runner.attest import attest
from tests.serving.enforcement.test_attest_listener import attest_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run callers as other users")

CLI = [sys.executable, "-m", "gpupool.cli.workload"]
HOLDER = str(Path(__file__).resolve().parents[2] / "workload" / "runner" / "holder.py")
GRACE_S = 1.0
INTERVAL_S = 0.2
STARVERS = range(60001, 60006)  # five other users
HELD = 6  # silent connections each keeps open
GIB = 1024

# A local user that holds the attestation socket busy (benchmarks/attest_starver.py says how).
STARVER = Path(__file__).resolve().parents[3] / "benchmarks" / "attest_starver.py"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder other users can reach (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-attest-", dir="/tmp"))
    os.chmod(folder, 0o755)
    (folder / "ready").mkdir(mode=0o777)
    os.chmod(folder / "ready", 0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_starvers(socket_path: Path, ready: Path, limit_s: float = 240.0) -> List[subprocess.Popen]:
    """One starver per uid of STARVERS, each holding HELD silent connections; returns once all
    have made their HELD connections."""
    procs = []
    for uid in STARVERS:
        procs.append(
            subprocess.Popen(
                [sys.executable, "-I", str(STARVER), str(uid), str(socket_path), str(HELD), str(ready / str(uid))]
                + [str(limit_s)],
                cwd="/",
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    try:
        wait_until(
            lambda: all((ready / str(uid)).exists() or p.poll() is not None for uid, p in zip(STARVERS, procs)),
            30,
            "every starver to hold its connections",
        )
        for proc in procs:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
    except BaseException:
        stop_all(procs)
        raise
    return procs


def stop_all(procs: List[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_starved_attestation_never_gets_a_job_killed(server_factory, shared_dir, tmp_path, monkeypatch):
    usage = tmp_path / "usage.json"
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(usage))
    server = server_factory(
        "--enforce-grace",
        str(GRACE_S),
        "--usage-interval",
        str(INTERVAL_S),
        "--enforce-unleased",
        "kill",
        state=shared_dir / "state",
    )
    answer = httpx.post(f"{server.url}/v1/tokens", json={"name": "alice"}, headers=server.headers())
    assert answer.status_code == 201, answer.text
    alice = answer.json()["token"]
    socket_path = server.state.resolve() / "attest" / "attest.sock"

    starvers = start_starvers(socket_path, shared_dir / "ready")
    record, stop = tmp_path / "alice.json", tmp_path / "alice.stop"
    runner = subprocess.Popen(
        CLI
        + ["run", "--server", server.url, "-p", "0.5", "--ttl", "30", "--", sys.executable, HOLDER]
        + [str(record), str(stop)],
        env=dict(server.client_env(tmp_path), GPUPOOL_TOKEN=alice),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: record.exists() or runner.poll() is not None, 60, "the command to start")
        assert record.exists(), runner.stderr.read() if runner.stderr else runner.returncode
        child = int(json.loads(record.read_text())["pid"])
        (lease,) = httpx.get(f"{server.url}/v1/status", headers=server.headers()).json()["leases"]
        # 2 GiB of its 8 GiB share, while the starvers still hammer the socket.
        assert all(p.poll() is None for p in starvers)
        started = time.time()
        write_usage(usage, {lease["devices"][0]["uuid"]: {child: 2 * GIB}})
        samples: Dict[float, dict] = {}
        while time.time() < started + GRACE_S + 10 * INTERVAL_S or len(samples) < 5:
            sample = httpx.get(f"{server.url}/v1/status", headers=server.headers()).json().get("usage") or {}
            if sample.get("sampled_at", 0) > started:
                samples[sample["sampled_at"]] = sample
            assert time.time() < started + 60, "no fresh usage samples"
            time.sleep(INTERVAL_S / 2)
        killed = {(a["reason"], a["mode"], a["pid"]) for s in samples.values() for a in s["actions"]}
        assert alive(child) and runner.poll() is None, f"the job was killed: {killed}"
        for sample in samples.values():
            owners = {p["pid"]: p["lease_id"] for p in sample["processes"]}
            assert owners.get(child) == lease["id"], sample
            assert not sample["actions"], sample["actions"]
        assert all(p.poll() is None for p in starvers), "the starvers ran throughout"
        stop.touch()
        assert runner.wait(timeout=30) == 0
        stderr = runner.stderr.read() if runner.stderr else ""
        assert "not attested" not in stderr, stderr
    finally:
        stop_all(starvers)
        if runner.poll() is None:
            runner.kill()
        runner.wait()


@pytest.mark.parametrize("cap", [MAX_CONNECTIONS, 8])  # 8: fewer in all than the starvers' budgets (5 x 4)
def test_the_socket_serves_other_users_through_the_starvers(shared_dir, cap):
    state = shared_dir / "state"
    state.mkdir(mode=0o755)
    listener = AttestListener(
        socket_path(state), AttestKeys(state), Attestations(), lambda lease_id: True, max_connections=cap
    ).start()
    starvers = start_starvers(listener.path, shared_dir / "ready")
    try:
        took = []
        for n in range(20):  # this process: another user than the starvers'
            started = time.monotonic()
            assert attest(str(listener.path), f"L{n}", listener.keys.key(f"L{n}")) == os.getpid()
            took.append(time.monotonic() - started)
        other = attest_as(60006, listener, "M")  # and a user who never connected before
        assert other.returncode == 0, other.stderr
        assert [w.uid for w in listener.attestations.current({"M"})["M"]] == [60006]
        assert all(p.poll() is None for p in starvers), "the starvers ran throughout"
        took.sort()
        print(
            f"cap {cap}: 20 attestations under the starvers, median {took[10] * 1000:.1f} ms, max {took[-1] * 1000:.1f} ms"
        )
    finally:
        stop_all(starvers)
        listener.stop()
