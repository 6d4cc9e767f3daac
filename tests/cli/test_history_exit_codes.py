"""Issue 25, done when: after 10 `gpupool run`s with known durations and exit codes, `gpupool usage
--by lease --json` reports each with its elapsed time and its exit code. The elapsed time is checked
by bounds a loaded machine cannot break (at least the command's sleep, at most the runner's
lifetime); how close it comes to the command's own time is printed. The runner says
its command's exit code at the release (a label, kept as given); a server keeps it too (the body of
DELETE /v1/leases/{id}, GET /v1/history) and refuses one out of range."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import httpx
from envs import clean_env
from waiting import wait_until

# Run i sleeps DURATIONS[i] and exits i. The lease spans a little more than its command: the runner
# sets the command up after the grant and releases after it ends.
DURATIONS = [4.0 + 0.25 * i for i in range(10)]


def test_ten_runs_are_listed_with_their_elapsed_time_and_exit_code(tmp_path: Path) -> None:
    state, flags, env = tmp_path / "state", tmp_path / "flags", clean_env(tmp_path, GPUPOOL_DEVICES="emulated:2x16GiB")
    flags.mkdir()
    runs: List[subprocess.Popen] = []
    launched: List[float] = []
    ended: Dict[int, float] = {}
    try:
        for i, seconds in enumerate(DURATIONS):
            # One after the other's command started (their set-ups do not compete), then side by side.
            script = f": > {flags}/{i}; sleep {seconds:.2f}; exit {i}"
            launched.append(time.time())
            runs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gpupool", "run", "-q", "--state", str(state), "-p", "0.2"]
                    + ["--label", f"run-{i}", "--", "sh", "-c", script],
                    env=env,
                )
            )
            wait_until(lambda i=i: (flags / str(i)).exists(), 60, f"run {i} started")

        def all_ended() -> bool:
            for i, proc in enumerate(runs):
                if i not in ended and proc.poll() is not None:
                    ended[i] = time.time()  # no later than this it ended: an upper bound on its lease
            return len(ended) == len(runs)

        wait_until(all_ended, 300, "the ten runs to end", interval=0.02)
        assert [proc.returncode for proc in runs] == list(range(10))
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
        print(f"run {i}: lease {row['elapsed_s']:.3f} s for a command of {seconds:.2f} s")
        # The command slept `seconds` inside the lease; the lease lay inside the runner's life.
        assert seconds <= row["elapsed_s"] <= ended[i] - launched[i] + 0.001, (seconds, row, ended[i] - launched[i])
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
