"""A local job whose gang lease borrows is preempted and requeued, as Kueue requeues a workload.

Two emulated GPUs, queues a and b of quota 1 each. Job A (queue a) holds both GPUs as one gang
lease, so it borrows one. A `gpupool run --queue b` claim takes its quota back: both replicas get
SIGTERM, the job shows Queued, B runs, and when B ends the job's replicas start again with
GPUPOOL_PREEMPTED=1 and GPUPOOL_ATTEMPT=2, then finish: the job succeeds with no restart spent.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from waiting import events, holds, wait_for_events, wait_until

PREEMPTEE = str(Path(__file__).resolve().parents[1] / "workload" / "runner" / "preemptee.py")

pytestmark = pytest.mark.slow


def test_a_preempted_job_is_requeued_whole_and_reruns_with_the_attempt_env(shell, tmp_path):
    shell.run("queue", "set", "a", "--quota", "1")
    shell.run("queue", "set", "b", "--quota", "1")
    log, stop = tmp_path / "a.jsonl", tmp_path / "a.stop"
    job = {
        "name": "team-a",
        "queue": "a",
        "roles": {
            "worker": {
                "replicas": 2,
                "command": [sys.executable, PREEMPTEE, str(log), str(stop)],
                "gpu": {"count": 1, "fraction": 1.0},
            }
        },
    }
    shell.run("submit", shell.write_spec(job))
    shell.wait_for("team-a", lambda s: s["status"] == "Running")
    first = wait_for_events(log, "start", 2)
    assert {e["attempt"] for e in first} == {None}

    b_stop = tmp_path / "b.stop"
    b = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpupool",
            "run",
            "--queue",
            "b",
            "-p",
            "1",
            "--",
            "sh",
            "-c",
            f"touch {tmp_path}/b.up; while [ ! -e {b_stop} ]; do sleep 0.05; done",
        ],
        env=shell.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert len(wait_for_events(log, "sigterm", 2)) == 2  # every replica of the gang, at once
        queued = shell.wait_for("team-a", lambda s: s["status"] == "Queued" and s["preemptions"] == 1)
        assert "preempted" in queued["message"]
        wait_until(lambda: (tmp_path / "b.up").exists() or b.poll() is not None, 30, "B's command to start")
        assert b.poll() is None, "B's command did not start"
        starts = lambda: [e for e in events(log) if e["event"] == "start"]  # noqa: E731
        holds(lambda: len(starts()) == 2, 1.0, "no rerun of A while B holds its GPU", detail=starts)
        b_stop.touch()
        _, err = b.communicate(timeout=30)
        assert b.returncode == 0, err
    finally:
        b_stop.touch()
        if b.poll() is None:
            b.kill()

    rerun = wait_for_events(log, "start", 4)[2:]
    assert [(e["attempt"], e["preempted"]) for e in rerun] == [("2", "1"), ("2", "1")]
    running = shell.wait_for("team-a", lambda s: s["status"] == "Running")
    assert running["restarts"] == 0 and running["lease_id"] != queued["lease_id"]
    stop.touch()
    done = shell.wait_for("team-a", lambda s: s["status"] == "Succeeded")
    assert done["preemptions"] == 1 and done["restarts"] == 0
    assert shell.leases() == []
