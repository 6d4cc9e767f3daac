"""Issue 25, item 4: who waits, and why: `gpupool status` lists each waiting claim with its place,
queue, priority, share, holder, age and the reason the pool gave it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict

from envs import clean_env
from waiting import wait_until


def test_status_lists_a_waiting_claim_with_its_reason(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = clean_env(tmp_path, GPUPOOL_DEVICES="emulated:1x16GiB")
    gpupool = [sys.executable, "-m", "gpupool"]
    # The holder holds, and the waiter waits, until the test kills them: far longer than its checks.
    holder = subprocess.Popen(
        [*gpupool, "run", "--state", str(state), "-p", "1", "--", sys.executable, "-c", "import time; time.sleep(600)"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    waiter = None
    try:
        wait_until(
            lambda: (state / "pool.db").exists() and _status(gpupool, state, env)["leases"], 60, "the first lease"
        )
        waiter = subprocess.Popen(
            [*gpupool, "run", "--state", str(state), "-p", "0.5", "--wait", "600", "--label", "second", "--", "true"],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: _status(gpupool, state, env)["waiting"], 60, "the second claim waiting")
        # the reason is written once the pool tried the claim (a poll or two)
        wait_until(lambda: _status(gpupool, state, env)["waiting"][0]["reason"], 60, "the claim's reason")
        (row,) = _status(gpupool, state, env)["waiting"]
        assert row["position"] == 1 and row["label"] == "second" and "0.5" in row["claim"]
        assert "free" in row["reason"] or "fit" in row["reason"] or "GPU" in row["reason"], row
        table = subprocess.run([*gpupool, "status", "--state", str(state)], env=env, capture_output=True, text=True)
        header = next(line for line in table.stdout.splitlines() if line.startswith("#"))
        assert header.split() == ["#", "ID", "QUEUE", "PRIO", "SHARE", "HOLDER", "WAITING", "WHY"]
    finally:
        for proc in (holder, waiter):
            if proc is not None:
                proc.kill()
                proc.wait()


def _status(gpupool: list, state: Path, env: Dict[str, str]) -> dict:
    done = subprocess.run(
        [*gpupool, "status", "--json", "--state", str(state)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
