"""Issue 28's faults with real processes: kill -9 of a runner while its lease is suspended, kill -9
of the server while a lease is suspended or half-way there, and a restore that fails."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest
from gpupool_cli import gpupool

from tests.conftest import start_server
from tests.pooling.pool.test_queues_e2e import leases
from tests.pooling.pool.test_suspend_e2e import Pool, continuous, proc_state
from tests.waiting import events, wait_dead, wait_for_events, wait_until

pytestmark = pytest.mark.slow


def test_kill_9_of_the_runner_while_suspended_ends_the_tree_and_the_lease(server_factory, tmp_path: Path) -> None:
    pool = Pool(server_factory(), tmp_path)
    runner, log, _ = pool.job("a", "a")
    lease_id, pid = str(events(log)[0]["lease"]), int(events(log)[0]["pid"])
    assert gpupool("suspend", lease_id, env=pool.env).returncode == 0
    assert proc_state(pid) == "T"
    runner.proc.send_signal(signal.SIGKILL)
    runner.wait()
    wait_dead(pid)  # a stopped, parked process is ended with its runner: nothing keeps its memory
    # no heartbeat: it expires within its TTL (30 s) from the last heartbeat, and the sweep
    wait_until(lambda: all(x["id"] != lease_id for x in leases(pool.env)), 120, "the lease to expire", interval=0.2)


@pytest.mark.parametrize("half_way", [False, True], ids=["suspended", "half-way"])
def test_kill_9_of_the_server_loses_no_suspended_lease(server_factory, tmp_path: Path, half_way: bool) -> None:
    server = server_factory()
    pool = Pool(server, tmp_path)
    runner, log, stop = pool.job("a", "a")
    lease_id, pid = str(events(log)[0]["lease"]), int(events(log)[0]["pid"])
    if half_way:  # asked, and the server dies before (or while) the runner reports
        answer = httpx.post(f"{server.url}/v1/leases/{lease_id}/suspend", json={}, headers=server.headers())
        assert answer.status_code == 200 and answer.json()["state"] == "suspending"
    else:
        assert gpupool("suspend", lease_id, env=pool.env).returncode == 0
    server.stop(signal.SIGKILL)
    time.sleep(1.0)  # the outage itself (the runner keeps calling into it)
    port = server.url.rsplit(":", 1)[1]
    restarted = start_server(server.state, "--listen", f"127.0.0.1:{port}")
    try:
        pool.env["GPUPOOL_TOKEN"] = restarted.token or ""
        pool.wait_state(lease_id, "suspended")  # the step is finished: parked, memory given back
        assert proc_state(pid) == "T" and pid not in pool.usage.pids()
        assert pool.lease(lease_id)["devices"] == []
        done = gpupool("resume", lease_id, env=pool.env)
        assert done.returncode == 0, done.stderr
        assert proc_state(pid) in ("S", "R") and pid in pool.usage.pids()
        ticks = len(continuous(log))
        wait_for_events(log, "tick", count=ticks + 3)
        stop.touch()
        assert runner.wait(30) == 0, runner.stderr
        continuous(log)
        assert [e["event"] for e in events(log) if e["event"] != "tick"] == ["start", "done"]
    finally:
        restarted.stop(signal.SIGKILL)


def test_a_failed_restore_leaves_the_lease_suspended_with_its_error(server_factory, tmp_path: Path) -> None:
    pool = Pool(server_factory(), tmp_path)
    runner, log, stop = pool.job("a", "a")
    lease_id, pid = str(events(log)[0]["lease"]), int(events(log)[0]["pid"])
    assert gpupool("suspend", lease_id, env=pool.env).returncode == 0
    lock = Path(str(pool.usage.path) + ".lock")
    lock.unlink()
    lock.mkdir()  # the emulated restore cannot rewrite the usage file (as root too)
    done = gpupool("resume", lease_id, env=pool.env)
    assert done.returncode == 1 and "could not rewrite" in done.stderr, done.stderr
    lease = pool.lease(lease_id)
    assert lease["state"] == "suspended" and lease["devices"] == [], "no GPU memory is held for it"
    assert "could not rewrite" in str(lease["suspension"]["error"])  # type: ignore[index]
    assert proc_state(pid) == "T", "the process stays parked, never half restored"
    shutil.rmtree(lock)
    done = gpupool("resume", lease_id, env=pool.env)
    assert done.returncode == 0, done.stderr
    stop.touch()
    assert runner.wait(30) == 0, runner.stderr
    continuous(log)


def test_a_preempted_lease_that_cannot_be_parked_is_requeued_with_the_reason(server_factory, tmp_path: Path) -> None:
    pool = Pool(server_factory(), tmp_path)
    pool.env.pop("GPUPOOL_EMULATED_USAGE")
    pool.env["GPUPOOL_SUSPEND_BACKEND"] = "cuda"  # which has no driver here (auto would take the emulated one)
    first, first_log, first_stop = pool.job("a1", "a")
    loan, loan_log, loan_stop = pool.job("a2", "a")
    b, b_log, b_stop = pool.job("b", "b")
    wait_for_events(loan_log, "sigterm")  # stopped: it could not be parked
    b_stop.touch()
    assert b.wait(30) == 0
    rerun = wait_for_events(loan_log, "start", count=2, timeout=60)  # requeued without --requeue, not exit 8
    assert rerun[1]["attempt"] == "2"
    assert "could not be suspended" in loan.stderr and "libcuda" in loan.stderr
    for stop, runner in ((first_stop, first), (loan_stop, loan)):
        stop.touch()
        assert runner.wait(60) == 0, runner.stderr
