"""Issue 36 item 2 through the real CLI: every preemption is counted and shown by its mode.

A server with queues a and b (quota 1 each) on 2 emulated GPUs. Team A fills both (one on loan);
team B's claim suspends the loan (the server's default mode): `queue list` shows PREEMPT suspend
and PREEMPTED 1 (1 suspended), /metrics counts it under mode="suspend", and once the loan has
resumed and ended `usage --by lease` shows it preempted/suspended. Queue a is then set to kill:
the next loan is stopped, counted as killed, and its history says preempted/killed, not
"released, exit 143".
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict

import httpx
import pytest

from tests.gpupool_cli import gpupool
from tests.pooling.pool.test_suspend_e2e import Pool
from tests.waiting import events

pytestmark = pytest.mark.slow


def _queue_row(env: Dict[str, str], name: str) -> str:
    """The line of queue `name` in `gpupool queue list`."""
    out = gpupool("queue", "list", env=env, check=True).stdout
    return next(line for line in out.splitlines() if line.split()[:1] == [name])


def _history(env: Dict[str, str]) -> Dict[str, Dict[str, object]]:
    rows = json.loads(gpupool("usage", "--by", "lease", "--since", "1h", "--json", env=env, check=True).stdout)[
        "leases"
    ]
    return {str(r["lease"]): r for r in rows}


def test_preemptions_are_counted_and_shown_by_mode(server_factory, tmp_path: Path) -> None:
    server = server_factory()
    pool = Pool(server, tmp_path)
    first, first_log, first_stop = pool.job("a1", "a")
    loan, loan_log, loan_stop = pool.job("a2", "a")
    loan_id = str(events(loan_log)[0]["lease"])
    b, b_log, b_stop = pool.job("b", "b")  # returns once B runs: the loan was suspended
    assert pool.lease(loan_id)["state"] == "suspended"

    row = _queue_row(pool.env, "a").split()
    assert row[4] == "suspend", f"PREEMPT shows the mode in force (the server's default): {row}"
    assert " ".join(row[8:]) == "1 (1 suspended)", row
    metrics = httpx.get(server.url + "/metrics").text
    assert 'gpupool_queue_preemptions_total{mode="suspend",queue="a"} 1.0' in metrics
    assert 'gpupool_queue_preemptions_total{mode="suspend",queue="b"} 0.0' in metrics

    b_stop.touch()
    assert b.wait(60) == 0, b.stderr
    pool.wait_state(loan_id, "running", timeout=60)
    loan_stop.touch()
    assert loan.wait(60) == 0, loan.stderr
    record = _history(pool.env)[loan_id]
    assert record["state"] == "preempted/suspended" and record["preempted"] == "suspend", record
    assert record["exit_code"] == 0  # its command's own: the suspension did not end it
    table = gpupool("usage", "--by", "lease", "--since", "1h", env=pool.env, check=True).stdout
    assert re.search(rf"^{loan_id} .* preempted/suspended +0$", table, re.M), table

    # kill: the next loan is stopped, counted as killed, and its history says so
    gpupool("queue", "set", "a", "--quota", "1", "--preempt", "kill", env=pool.env, check=True)
    killed, killed_log, _ = pool.job("a3", "a")
    killed_id = str(events(killed_log)[0]["lease"])
    b2, b2_log, b2_stop = pool.job("b2", "b")
    assert killed.wait(120) == 8, killed.stderr  # Preempted's exit code: stopped, not rerun
    row = _queue_row(pool.env, "a").split()
    assert row[4] == "kill" and " ".join(row[8:]) == "2 (1 suspended, 1 killed)", row
    metrics = httpx.get(server.url + "/metrics").text
    assert 'gpupool_queue_preemptions_total{mode="kill",queue="a"} 1.0' in metrics
    record = _history(pool.env)[killed_id]
    assert record["state"] == "preempted/killed", record
    for stop, runner in ((b2_stop, b2), (first_stop, first)):
        stop.touch()
        assert runner.wait(60) == 0, runner.stderr
