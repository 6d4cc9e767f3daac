"""Issue 25, done when: after 10 `gpupool run`s with known durations and exit codes, `gpupool usage
--by lease --json` reports each with its elapsed time within 2 % and its exit code. The runner says
its command's exit code at the release (a label, kept as given); a server keeps it too (the body of
DELETE /v1/leases/{id}, GET /v1/history) and refuses one out of range."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import httpx
from waiting import wait_until

# Run i sleeps DURATIONS[i] and exits i. The lease spans a little more than its command: the runner
# sets the command up after the grant (15-70 ms on a loaded 2-core machine), so the shortest run is
# long enough for 2 % of it to hold that.
DURATIONS = [4.0 + 0.25 * i for i in range(10)]


def env_for(tmp_path: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(HOME=str(tmp_path / "home"), GPUPOOL_DEVICES="emulated:2x16GiB")
    return env


def test_ten_runs_are_listed_with_their_elapsed_time_and_exit_code(tmp_path: Path) -> None:
    state, flags, env = tmp_path / "state", tmp_path / "flags", env_for(tmp_path)
    flags.mkdir()
    runs: List[subprocess.Popen] = []
    try:
        for i, seconds in enumerate(DURATIONS):
            # One after the other's command started (their set-ups do not compete), then side by side.
            script = f": > {flags}/{i}; sleep {seconds:.2f}; exit {i}"
            runs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gpupool", "run", "-q", "--state", str(state), "-p", "0.2"]
                    + ["--label", f"run-{i}", "--", "sh", "-c", script],
                    env=env,
                )
            )
            wait_until(lambda i=i: (flags / str(i)).exists(), 30, f"run {i} started")
        assert [proc.wait(60) for proc in runs] == list(range(10))
    finally:
        for proc in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "usage", "--by", "lease", "--json", "--state", str(state)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["label"]: row for row in json.loads(done.stdout)["leases"]}
    assert len(rows) == 10
    for i, seconds in enumerate(DURATIONS):
        row = rows[f"run-{i}"]
        assert row["exit_code"] == i and row["ended"] == "released", row
        assert seconds <= row["elapsed_s"] <= seconds * 1.02, (seconds, row)
    table = subprocess.run(
        [sys.executable, "-m", "gpupool", "usage", "--by", "lease", "--state", str(state)],
        env=env,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert table[1].split()[-2:] == ["ENDED", "EXIT"] and table[2].split()[-2:] == ["released", "0"]
    as_csv = subprocess.run(
        [sys.executable, "-m", "gpupool", "usage", "--by", "lease", "--csv", "--state", str(state)],
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert sorted(int(r["exit_code"]) for r in csv.DictReader(io.StringIO(as_csv))) == list(range(10))


def test_a_server_keeps_the_exit_code_its_runner_says(running_server, tmp_path: Path) -> None:
    server = running_server
    env = server.client_env(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "gpupool", "run", "-q", "--server", server.url, "-p", "0.5", "--", "sh", "-c", "exit 7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 7, run.stderr
    (row,) = httpx.get(f"{server.url}/v1/history", params={"since": "3600"}, headers=server.headers()).json()["leases"]
    assert row["exit_code"] == 7
    claim = {"claim": {"requests": [{"count": 1, "fraction": 0.25}]}}
    lease = httpx.post(f"{server.url}/v1/leases", json=claim, headers=server.headers()).json()["id"]
    for body in ({"exit_code": 256}, {"exit_code": -1}, {"exit_code": "3"}, {"exit_code": 1.5}, {"code": 3}):
        refused = httpx.request("DELETE", f"{server.url}/v1/leases/{lease}", json=body, headers=server.headers())
        assert refused.status_code == 400, (body, refused.text)
        assert "exit_code" in refused.json()["error"]["message"] or "code" in refused.json()["error"]["message"]
    said = httpx.request("DELETE", f"{server.url}/v1/leases/{lease}", json={"exit_code": 0}, headers=server.headers())
    assert said.status_code == 200
    rows = httpx.get(f"{server.url}/v1/history", params={"since": "3600"}, headers=server.headers()).json()["leases"]
    assert {r["lease"]: r["exit_code"] for r in rows}[lease] == 0
