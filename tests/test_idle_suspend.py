"""Idle reclaim (issue 28): `gpupool run --idle-suspend 3s` whose process keeps its emulated GPU 0 %
busy is suspended within 3 s and one watchdog sample; `gpupool resume` brings it back. A busy one
is left alone."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from gpupool.isolation.env import EMULATED_USAGE_ENV
from tests.test_queues_e2e import CLI, cli, events
from tests.test_suspend_e2e import Pool, continuous, proc_state

pytestmark = pytest.mark.slow
INTERVAL_S = 0.5
IDLE_S = 3.0


def test_an_idle_queue_lease_is_suspended_by_the_queues_limit(server_factory, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(tmp_path / "usage.json"))
    pool = Pool(server_factory("--usage-interval", f"{INTERVAL_S:g}"), tmp_path)
    cli(pool.env, "queue", "set", "b", "--quota", "1", "--idle-suspend", "3s")
    idle, log, stop = pool.job("idle", "b", utilization=0.0)  # no limit of its own: its queue's
    lease_id = str(events(log)[0]["lease"])
    pool.wait_state(lease_id, "suspended", timeout=IDLE_S + 60)
    assert pool.lease(lease_id)["suspension"]["by"] == "idle"  # type: ignore[index]
    idle.proc.kill()
    idle.wait()


def test_an_idle_lease_is_suspended_and_resumes_on_request(server_factory, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(tmp_path / "usage.json"))  # the server's watchdog samples it
    pool = Pool(server_factory("--usage-interval", f"{INTERVAL_S:g}"), tmp_path)
    busy, busy_log, busy_stop = pool.job("busy", "a", flags=["--idle-suspend", "3s"], utilization=0.4)
    registered = time.monotonic()
    idle, log, stop = pool.job("idle", "b", flags=["--idle-suspend", "3s"], utilization=0.0)
    lease_id, pid = str(events(log)[0]["lease"]), int(events(log)[0]["pid"])
    took = pool.wait_state(lease_id, "suspended", timeout=IDLE_S + 60)
    since_registered = time.monotonic() - registered
    # The first idle sample comes within one interval of the usage row; the limit runs from it: never
    # sooner. How much later is a loaded machine's to say (printed; the wait above bounds it).
    print(
        f"suspended {since_registered:.2f} s after its usage row (idle limit {IDLE_S:g} s, sampled every {INTERVAL_S:g} s)"
    )
    assert since_registered >= IDLE_S - INTERVAL_S, (since_registered, took)
    lease = pool.lease(lease_id)
    assert lease["suspension"]["by"] == "idle" and proc_state(pid) == "T"  # type: ignore[index]
    busy_lease = str(events(busy_log)[0]["lease"])
    assert pool.lease(busy_lease)["state"] == "running", "a busy lease is never idle-suspended"
    done = subprocess.run(CLI + ["resume", lease_id], env=pool.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert proc_state(pid) in ("S", "R")
    for stop_file, runner in ((stop, idle), (busy_stop, busy)):
        stop_file.touch()
        assert runner.wait(30) == 0, runner.stderr
    continuous(log)
