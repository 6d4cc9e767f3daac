"""Issue 25: history like sacct: `gpupool usage --by lease` lists each lease that ended (holder,
label, queue, share, start, end, elapsed, suspended, GPU-hours, how it ended), on the embedded pool
and through a server (GET /v1/history)."""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from pathlib import Path

import httpx
from envs import clean_env
from gpupool_cli import gpupool


def test_each_ended_lease_is_listed_with_its_span_and_end(tmp_path: Path) -> None:
    state = ["--state", str(tmp_path / "s")]
    launched = time.time()
    env = clean_env(tmp_path, GPUPOOL_DEVICES="emulated:2x16GiB")
    run = gpupool(
        "run",
        *state,
        "-p",
        "0.5",
        "--label",
        "exp-1",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(0.5)",
        env=env,
    )
    lived = time.time() - launched  # the lease lay within the run's life
    assert run.returncode == 0, run.stderr
    listed = gpupool("usage", "--by", "lease", "--json", *state, env=env)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["leases"]
    assert row["label"] == "exp-1" and row["gpus"] == 0.5 and row["ended"] == "released"
    assert 0.5 <= row["elapsed_s"] <= lived and abs(row["gpu_seconds"] - 0.5 * row["elapsed_s"]) < 1e-3
    table = gpupool("usage", "--by", "lease", *state, env=env).stdout.splitlines()
    assert table[0] == f"pool: embedded {tmp_path / 's'}"
    assert table[1].split()[:3] == ["LEASE", "HOLDER", "QUEUE"] and "exp-1" in table[2] and "released" in table[2]
    (parsed,) = list(csv.DictReader(io.StringIO(gpupool("usage", "--by", "lease", "--csv", *state, env=env).stdout)))
    assert parsed["lease"] == row["lease"] and parsed["ended"] == "released"


def test_the_server_answers_the_history(running_server, tmp_path: Path) -> None:
    s = running_server
    lease = httpx.post(
        f"{s.url}/v1/leases", json={"claim": {"requests": [{"count": 1, "fraction": 0.25}]}}, headers=s.headers()
    )
    assert lease.status_code == 201
    assert httpx.delete(f"{s.url}/v1/leases/{lease.json()['id']}", headers=s.headers()).status_code == 200
    answer = httpx.get(f"{s.url}/v1/history", params={"since": "3600"}, headers=s.headers())
    assert answer.status_code == 200
    (row,) = answer.json()["leases"]
    assert row["lease"] == lease.json()["id"] and row["gpus"] == 0.25 and row["ended"] == "released"
    bad = httpx.get(f"{s.url}/v1/history", params={"since": "nan"}, headers=s.headers())
    assert bad.status_code == 400
