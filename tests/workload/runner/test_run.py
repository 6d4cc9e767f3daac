"""`gpupool run` as real processes on an embedded, emulated pool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List

import pytest
from waiting import wait_until

from gpupool.pooling.isolation.env import CONTEXT_RESERVE_MIB

HOLDER = str(Path(__file__).with_name("holder.py"))


def read_record(path: Path) -> dict:
    wait_until(path.exists, timeout=15, what=f"{path}")
    return json.loads(path.read_text())


def test_child_env_carries_the_contract_and_lease_is_released(pool, tmp_path):
    record = tmp_path / "env.json"
    done = pool.run("run", "-n", "1", "-p", "0.5", "--label", "envtest", "--", sys.executable, HOLDER, str(record))
    assert done.returncode == 0, done.stderr
    env = json.loads(record.read_text())["env"]
    uuid = pool.status()["devices"][0]["uuid"]
    assert env["CUDA_VISIBLE_DEVICES"] == uuid
    assert env["GPUPOOL_LEASE_ID"]
    assert env["GPUPOOL_MEMORY_LIMIT_MIB"] == "8192"
    assert env["GPUPOOL_MEMORY_FRACTION"] == "0.5"
    # The hooks mode (an embedded pool's): the allocator gets the grant less the context reserve.
    allocator_mib = 8192 - CONTEXT_RESERVE_MIB
    assert env["GPUPOOL_ALLOCATOR_LIMIT_MIB"] == str(allocator_mib)
    assert env["GPUPOOL_ALLOCATOR_FRACTION"] == f"{allocator_mib / 16384:.4f}".rstrip("0")
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == env["GPUPOOL_ALLOCATOR_FRACTION"]
    assert not [k for k in env if k.startswith("CUDA_MPS_")], "MPS variables belong to the mps mode only"
    hook_dir = env["GPUPOOL_HOOK_DIR"]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == hook_dir
    assert not Path(hook_dir).exists(), "the generated config dir must be removed at release"
    for line in (
        "Requested resources",
        "Choosing GPUs from server list",
        "Locked 1 GPUs",
        "Running client command",
        "Releasing GPUs from config file",
        "Released GPUs on 1 servers",
    ):
        assert f"gpupool: {line}" in done.stderr
    assert pool.status()["leases"] == []


def test_memory_claim_on_two_gpus(pool2, tmp_path):
    record = tmp_path / "env.json"
    done = pool2.run("run", "-n", "2", "-m", "4GiB", "--policy", "spread", "--", sys.executable, HOLDER, str(record))
    assert done.returncode == 0, done.stderr
    env = json.loads(record.read_text())["env"]
    uuids = {d["uuid"] for d in pool2.status()["devices"]}
    assert set(env["CUDA_VISIBLE_DEVICES"].split(",")) == uuids
    assert env["GPUPOOL_MEMORY_LIMIT_MIB"] == "4096,4096"
    assert env["GPUPOOL_MEMORY_FRACTION"] == "0.25,0.25"
    assert env["GPUPOOL_ALLOCATOR_LIMIT_MIB"] == f"{4096 - CONTEXT_RESERVE_MIB},{4096 - CONTEXT_RESERVE_MIB}"


@pytest.mark.parametrize(
    "child, expected",
    [
        (["true"], 0),
        (["sh", "-c", "exit 3"], 3),
        (["sh", "-c", "kill -TERM $$"], 128 + 15),
        (["sh", "-c", "kill -KILL $$"], 128 + 9),
    ],
)
def test_exit_code_is_the_childs(pool, child, expected):
    done = pool.run("run", "-p", "0.25", "-q", "--", *child)
    assert done.returncode == expected, done.stderr
    assert pool.status()["leases"] == []


@pytest.mark.parametrize("signum, expected", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_signal_to_runner_is_forwarded_and_lease_released(pool, tmp_path, signum, expected):
    record = tmp_path / "rec.json"
    runner = pool.start("run", "-p", "0.5", "--", sys.executable, HOLDER, str(record), str(tmp_path / "never"))
    try:
        info = read_record(record)
        assert info["pgid"] == info["pid"], "the child leads its own process group"
        assert len(pool.status()["leases"]) == 1
        runner.send_signal(signum)
        _, err = runner.communicate(timeout=15)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == expected, err
    assert "Released GPUs on 1 servers" in err
    assert pool.status()["leases"] == []
    assert not _alive(info["pid"])


def test_two_halves_fit_third_fails_fast_or_waits(pool, tmp_path):
    stops = [tmp_path / f"stop{i}" for i in range(3)]
    records = [tmp_path / f"rec{i}.json" for i in range(3)]
    first = [
        pool.start("run", "-p", "0.5", "--", sys.executable, HOLDER, str(records[i]), str(stops[i])) for i in range(2)
    ]
    waiting = None
    try:
        for r in records[:2]:
            read_record(r)
        status = pool.status()
        assert len(status["leases"]) == 2
        assert status["devices"][0]["allocated_mib"] == 16384

        fast = pool.run("run", "-p", "0.5", "--wait", "0", "--", "true")
        assert fast.returncode == 3
        assert "--wait" in fast.stderr and "Traceback" not in fast.stderr

        waiting = pool.start("run", "-p", "0.5", "--wait", "30", "--", sys.executable, HOLDER, str(records[2]))
        wait_until(lambda: pool.status()["queued"] == 1, timeout=15, what="the third claim to queue")
        assert not records[2].exists()
        stops[0].touch()
        assert first[0].wait(timeout=15) == 0
        _, err = waiting.communicate(timeout=30)
        assert waiting.returncode == 0, err
        assert "Waiting up to 30s in the queue" in err
        assert records[2].exists()
    finally:
        for s in stops:
            s.touch()
        for p in first + ([waiting] if waiting else []):
            p.wait(timeout=15)
    assert pool.status()["leases"] == []


def test_killed_runner_lease_is_reclaimed_after_ttl(pool, tmp_path):
    record, stop = tmp_path / "rec.json", tmp_path / "stop"
    # TTL 5 s: heartbeats (every 5/3 s) keep it until the kill, though a loaded machine pause them a while
    runner = pool.start("run", "-p", "0.5", "--ttl", "5", "--", sys.executable, HOLDER, str(record), str(stop))
    try:
        read_record(record)
        assert len(pool.status()["leases"]) == 1
        runner.kill()  # kill -9: no release, no more heartbeats
        runner.wait(timeout=30)
        assert len(pool.status()["leases"]) == 1  # not released: it is left to its TTL
        wait_until(lambda: pool.status()["leases"] == [], timeout=60, what="the lease to expire")
    finally:
        stop.touch()


def test_heartbeat_keeps_lease_past_ttl_and_warns_when_lost(pool, tmp_path):
    record, stop = tmp_path / "rec.json", tmp_path / "stop"
    runner = pool.start(
        "run",
        "-p",
        "0.5",
        "--ttl",
        "1",
        "--on-lease-loss",
        "warn",
        "--",
        sys.executable,
        HOLDER,
        str(record),
        str(stop),
    )
    try:
        env = read_record(record)["env"]
        time.sleep(1.6)  # the TTL (1 s) passes: only heartbeats keep the lease (what is tested)
        leases = pool.status()["leases"]
        assert [lease["id"] for lease in leases] == [env["GPUPOOL_LEASE_ID"]]
        released = pool.run("release", env["GPUPOOL_LEASE_ID"])
        assert released.returncode == 0, released.stderr
        # the command runs on with its lease released until the runner has said so (its next heartbeat)
        said: List[str] = []
        reader = threading.Thread(target=lambda: said.extend(runner.stderr or ()), daemon=True)
        reader.start()
        wait_until(lambda: "was released by its owner" in "".join(said), 30, "the runner to say the lease was released")
        stop.touch()
        runner.wait(timeout=15)
        reader.join(15)
        err = "".join(said)
    finally:
        stop.touch()
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0
    assert "WARNING: lease" in err and "was released by its owner" in err and "the command still runs" in err
    assert "already gone" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["-p", "1.5", "--", "true"], "outside (0, 1]"),
        (["-p", "0", "--", "true"], "outside (0, 1]"),
        (["-p", "half", "--", "true"], "not a number"),
        (["-n", "0", "--", "true"], "-n 1"),
        (["-n", "3", "-p", "0.5", "--", "true"], "match"),
        (["-m", "32GiB", "--", "true"], "needs 1 GPU"),
        (["--filter", "colour=blue", "--", "true"], "filter key 'colour' is unknown"),
        (["-p", "0.5", "-m", "100", "--", "true"], "not allowed with argument"),
        (["-p", "0.5"], "no command to run"),
        (["-p", "0.5", "--"], "no command to run"),
        (["--server", "ftp://pool:1", "--", "true"], "unknown scheme"),
        (["--policy", "random", "--", "true"], "policy 'random' is unknown"),
        (["--ttl", "0", "--", "true"], "--ttl"),
        (["--", "/no/such/program"], "was not found"),
    ],
)
def test_bad_input_exits_2_with_a_message(pool, args, message):
    done = pool.run("run", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert pool.status()["leases"] == []


def test_status_table_and_release_unknown(pool):
    done = pool.run("status")
    assert done.returncode == 0
    assert "GPU" in done.stdout and "16GiB" in done.stdout and "no leases" in done.stdout
    listed = pool.run("list-gpus", "--json")
    assert json.loads(listed.stdout)["devices"][0]["memory_mib"] == 16384
    gone = pool.run("release", "nope")
    assert gone.returncode == 4 and "does not exist" in gone.stderr


def test_full_cli_registers_the_workload_verbs(pool):
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "status", "--json"], env=pool.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) >= {"devices", "leases"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="needs torch (CPU build is enough)")
def test_hook_reaches_torch_in_the_child(pool):
    env = dict(pool.env, GPUPOOL_HOOK_DEBUG="1")
    done = pool.run("run", "-p", "0.5", "-q", "--", sys.executable, "-c", "import torch", env=env)
    assert done.returncode == 0, done.stderr
    fraction = f"{(8192 - CONTEXT_RESERVE_MIB) / 16384:.4f}".rstrip("0")
    assert f"gpupool-hook: torch: skipped (no CUDA); would set memory fraction {fraction}" in done.stderr


def test_sigterm_while_queued_leaves_no_lease_and_no_ticket(pool, tmp_path):
    record, stop = tmp_path / "rec.json", tmp_path / "stop"
    hog = pool.start("run", "-p", "1", "--", sys.executable, HOLDER, str(record), str(stop))
    try:
        read_record(record)
        waiting = pool.start("run", "-p", "0.5", "--wait", "30", "--", "true")
        wait_until(lambda: pool.status()["queued"] == 1, timeout=15, what="the claim to queue")
        waiting.send_signal(signal.SIGTERM)
        _, err = waiting.communicate(timeout=15)
        assert waiting.returncode == 143
        assert "before the command started" in err and "Traceback" not in err
        status = pool.status()
        assert status["queued"] == 0 and len(status["leases"]) == 1
    finally:
        stop.touch()
        hog.wait(timeout=15)
