"""Fixtures for local job tests: a state dir with 2 emulated 16 GiB GPUs, and the CLI as another shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest
import yaml
from waiting import tail, wait_until

REPO = Path(__file__).resolve().parents[2]


class Shell:
    """Runs `gpupool` in a separate process, as a user's other shell would."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.env = dict(os.environ, GPUPOOL_STATE=str(state), GPUPOOL_DEVICES="emulated:2x16GiB")
        self.env.pop("GPUPOOL_SERVER", None)

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "gpupool", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.state,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"gpupool {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def write_spec(self, data: dict) -> str:
        path = self.state / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data))
        return str(path)

    def state_of(self, name: str) -> dict:
        import json

        return json.loads((self.state / "jobs" / name / "state.json").read_text())

    def wait_for(self, name: str, pred, timeout: float = 60.0) -> dict:
        """Job `name`'s state once `pred` holds for it; the failure shows the last state and the supervisor's log."""
        last: List[Optional[dict]] = [None]

        def state() -> Optional[dict]:
            try:
                last[0] = self.state_of(name)
            except (FileNotFoundError, ValueError):
                return None  # not written yet, or half-written
            return last[0] if pred(last[0]) else None

        log = self.state / "jobs" / name / "logs" / "supervisor.log"
        return wait_until(
            state, timeout, f"job {name}'s state", interval=0.1, detail=lambda: f"state {last[0]}\n{tail(log, 100_000)}"
        )

    def leases(self) -> list:
        from gpupool.workload.client.embedded import EmbeddedPoolClient

        with EmbeddedPoolClient(self.state) as client:
            return list(client.status().leases)

    def queued(self) -> int:
        from gpupool.workload.client.embedded import EmbeddedPoolClient

        with EmbeddedPoolClient(self.state) as client:
            return client.status().queued


@pytest.fixture
def shell(tmp_path):
    sh = Shell(tmp_path)
    yield sh
    # Never leave a job behind, whatever the test did.
    from gpupool.jobs.executors.local import processes

    jobs = tmp_path / "jobs"
    if jobs.is_dir():
        for job_dir in jobs.iterdir():
            if job_dir.is_dir():
                processes.sweep(job_dir)
