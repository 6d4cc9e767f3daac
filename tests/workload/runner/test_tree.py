"""`gpupool run` owns its child's whole process tree: nothing runs on a GPU without a live lease.

Real processes: a child that leaves a grandchild and a setsid'd daemon, the runner killed with
SIGKILL (embedded pool and a real `gpupool server`), background jobs left at exit, and a lease
released by an admin while its command runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterable, List

import pytest
from waiting import wait_until

from gpupool.core.errors import LeaseLost
from gpupool.pooling.isolation.proctree import alive

from .test_run import HOLDER, read_record

SPAWNER = str(Path(__file__).with_name("spawner.py"))
CLI = [sys.executable, "-m", "gpupool.cli.workload"]


def kill_pids(pids: Iterable[int]) -> None:
    """Test cleanup: SIGKILL whatever is left, whatever the test's outcome."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def stop_runner(runner: subprocess.Popen) -> None:
    if runner.poll() is None:
        runner.kill()
    runner.wait(timeout=10)


def tree_of(record: Path) -> List[int]:
    info = read_record(record)
    return [info["pid"], info["grandchild"], info["daemon"]]


def assert_all_gone_within(pids: List[int], seconds: float) -> None:
    wait_until(
        lambda: not any(alive(p) for p in pids), seconds, f"{pids} to end", detail=lambda: [p for p in pids if alive(p)]
    )


def test_kill_9_of_the_runner_ends_child_grandchild_and_daemon(pool, tmp_path):
    record = tmp_path / "tree.json"
    runner = pool.start("run", "-p", "0.5", "--ttl", "30", "--", sys.executable, SPAWNER, str(record))
    pids: List[int] = []
    try:
        pids = tree_of(record)
        assert all(alive(p) for p in pids)
        runner.kill()
        runner.wait(timeout=5)
        assert_all_gone_within(pids, 2.0)
    finally:
        stop_runner(runner)
        kill_pids(pids)


# `gpupool run` with no guard (as where there is no /proc to run one on): the parent-death signal
# alone still ends the command.
UNGUARDED = """\
import sys
import threading
from gpupool.cli.workload import main
from gpupool.workload.runner import session
session.Guard.spawn = lambda *args: None
sys.exit(main())
"""


def test_kill_9_of_an_unguarded_runner_ends_the_command_through_its_parent_death_signal(pool, tmp_path):
    record = tmp_path / "tree.json"
    argv = [sys.executable, "-c", UNGUARDED, "run", "-p", "0.5", "--", sys.executable, SPAWNER, str(record)]
    runner = subprocess.Popen(argv, env=pool.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: List[int] = []
    try:
        pids = tree_of(record)
        runner.kill()
        runner.wait(timeout=5)
        # The kernel's signal reaches the direct child only: the rest of the tree is the guard's work.
        assert_all_gone_within(pids[:1], 2.0)
    finally:
        stop_runner(runner)
        kill_pids(pids)


def test_kill_9_of_the_runner_against_a_real_server(running_server, tmp_path):
    pytest.importorskip("fastapi")
    env = running_server.client_env(tmp_path)
    record = tmp_path / "tree.json"
    runner = subprocess.Popen(
        CLI
        + [
            "run",
            "--server",
            running_server.url,
            "-p",
            "0.5",
            "--ttl",
            "30",
            "--",
            sys.executable,
            SPAWNER,
            str(record),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: List[int] = []
    try:
        pids = tree_of(record)
        assert all(alive(p) for p in pids)
        runner.kill()
        runner.wait(timeout=5)
        assert_all_gone_within(pids, 2.0)
    finally:
        stop_runner(runner)
        kill_pids(pids)


def test_background_job_left_at_exit_is_ended_before_release(pool, tmp_path):
    pid_file = tmp_path / "sleep.pid"
    script = f"sleep 1000 & echo $! > {pid_file}; exit 0"
    done = pool.run("run", "-p", "0.5", "--", "sh", "-c", script)
    sleep_pid = int(pid_file.read_text())
    try:
        assert done.returncode == 0, done.stderr
        assert not alive(sleep_pid), "the background sleep outlived the lease"
        assert "Released GPUs on 1 servers" in done.stderr
        assert pool.status()["leases"] == []
    finally:
        kill_pids([sleep_pid])


def test_normal_exit_ends_the_setsid_daemon_too(pool, tmp_path):
    record, stop = tmp_path / "tree.json", tmp_path / "stop"
    runner = pool.start("run", "-p", "0.5", "--", sys.executable, SPAWNER, str(record), str(stop))
    pids: List[int] = []
    try:
        pids = tree_of(record)
        stop.touch()
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == 0, err
        assert [p for p in pids if alive(p)] == []  # gone before the runner exited
        assert pool.status()["leases"] == []
    finally:
        stop.touch()
        stop_runner(runner)
        kill_pids(pids)


def test_lease_released_by_an_admin_ends_the_command(pool, tmp_path):
    record = tmp_path / "tree.json"
    # -q: the lost-lease notice is shown even when quiet.
    runner = pool.start("run", "-q", "-p", "0.5", "--ttl", "30", "--", sys.executable, SPAWNER, str(record))
    pids: List[int] = []
    try:
        pids = tree_of(record)
        lease_id = pool.status()["leases"][0]["id"]
        # Another local user, the admin of the embedded pool, releases it (the runner's user would be its owner).
        admin = dict(pool.env, LOGNAME="someone-else", USER="someone-else")
        released = pool.run("release", lease_id, env=admin)
        assert released.returncode == 0, released.stderr
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == LeaseLost.exit_code, err
        assert (
            f"gpupool: lease {lease_id!r} was released by an admin: ending the command (SIGTERM, SIGKILL after "
        ) in err
        assert f"exit code {LeaseLost.exit_code}; use --on-lease-loss warn to keep it running" in err
        assert "already gone" in err
        assert [p for p in pids if alive(p)] == []
        assert "Traceback" not in err
    finally:
        stop_runner(runner)
        kill_pids(pids)


def test_lease_loss_in_warn_mode_lets_the_command_finish(pool, tmp_path):
    record, stop = tmp_path / "rec.json", tmp_path / "stop"
    runner = pool.start(
        "run",
        "-p",
        "0.5",
        "--ttl",
        "30",
        "--on-lease-loss",
        "warn",
        "--",
        sys.executable,
        HOLDER,
        str(record),
        str(stop),
    )
    pid = 0
    lines: List[str] = []
    # stderr read as it comes: the warning is waited for, not slept for
    reader = threading.Thread(target=lambda: lines.extend(iter(runner.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        info = read_record(record)
        pid = info["pid"]
        released = pool.run("release", info["env"]["GPUPOOL_LEASE_ID"])
        assert released.returncode == 0, released.stderr
        wait_until(
            lambda: any("WARNING: lease" in line for line in list(lines)), 60, "the runner to see the lease gone"
        )
        assert alive(pid), "warn mode must keep the command running"
        stop.touch()
        assert runner.wait(timeout=60) == 0, "".join(lines)
        reader.join(30)
        err = "".join(lines)
        assert "WARNING: lease" in err and "the command still runs without a lease" in err
        assert "had ended while it ran" in err
    finally:
        stop.touch()
        stop_runner(runner)
        kill_pids([pid] if pid else [])


def test_lease_loss_against_a_real_server(running_server, tmp_path):
    pytest.importorskip("fastapi")
    env = running_server.client_env(tmp_path)
    record = tmp_path / "tree.json"
    runner = subprocess.Popen(
        CLI
        + [
            "run",
            "--server",
            running_server.url,
            "-p",
            "0.5",
            "--ttl",
            "30",
            "--",
            sys.executable,
            SPAWNER,
            str(record),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: List[int] = []
    try:
        pids = tree_of(record)
        status = subprocess.run(
            CLI + ["status", "--json", "--server", running_server.url],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lease_id = json.loads(status.stdout)["leases"][0]["id"]
        released = subprocess.run(
            CLI + ["release", lease_id, "--server", running_server.url],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert released.returncode == 0, released.stderr
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == LeaseLost.exit_code, err
        # The run and the release both send the admin token: the lease's own holder released it.
        assert f"lease {lease_id!r} was released by its owner ('admin')" in err
        assert [p for p in pids if alive(p)] == []
    finally:
        stop_runner(runner)
        kill_pids(pids)
