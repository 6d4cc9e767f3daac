"""Issue 36 item 3: a queue's default and maximum wall-time limit (Slurm's DefaultTime and MaxTime),
through the real CLI: `gpupool queue set --default-time/--max-time`; a run in the queue without
--time gets the default (exit 12 past it, the line naming the queue's default); a --time above the
max is refused in one line naming both (exit 2) and starts nothing; a token bound to the queue gets
the default without naming the queue. On an embedded pool and through a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from envs import embedded_env
from gpupool_cli import gpupool

from gpupool.core.errors import InvalidInput, TimeLimit


def check_queue_times(env: Dict[str, str], tmp_path: Path, *pool: str) -> None:
    made = gpupool(
        "queue",
        "set",
        "team-a",
        "--quota",
        "1",
        "--default-time",
        "2s",
        "--max-time",
        "1h",
        *pool,
        env=env,
    )
    assert made.returncode == 0, made.stderr
    assert "default-time 2s, max-time 1h" in made.stderr, made.stderr
    listed = json.loads(gpupool("queue", "list", "--json", *pool, env=env).stdout)["queues"]
    assert [(q["name"], q["default_time_s"], q["max_time_s"]) for q in listed] == [("team-a", 2.0, 3600.0)]

    # No --time: the queue's default ends it.
    ran = gpupool("run", "--queue", "team-a", "-p", "0.5", *pool, "--", "sleep", "600", env=env)
    assert ran.returncode == TimeLimit.exit_code, ran.stderr
    assert "time limit 2s reached (queue team-a's default): ending the command" in ran.stderr, ran.stderr

    # Above the max: refused before the command starts, one line naming the value and the max.
    marker = tmp_path / "started"
    over = gpupool(
        "run",
        "-q",
        "--queue",
        "team-a",
        "--time",
        "2h",
        "-p",
        "0.5",
        *pool,
        "--",
        "touch",
        str(marker),
        env=env,
    )
    assert over.returncode == InvalidInput.exit_code, over.stderr
    assert "--time 2h is above queue team-a's max time 1h: give --time 1h or less" in over.stderr, over.stderr
    assert over.stderr.count("\n") == 1 and "Traceback" not in over.stderr
    assert not marker.exists()

    # Within the max: its own --time, not the default (sleep 3 outlives the 2 s default).
    within = gpupool("run", "-q", "--queue", "team-a", "--time", "10m", "-p", "0.5", *pool, "--", "sleep", "3", env=env)
    assert within.returncode == 0, within.stderr

    # Another queue, and no queue, are untouched.
    assert gpupool("run", "-q", "-p", "0.5", *pool, "--", "sleep", "3", env=env).returncode == 0
    ended = history(env, *pool)
    assert ended == ["timeout", "released", "released"], ended


def history(env: Dict[str, str], *pool: str) -> List[str]:
    done = gpupool("usage", "--by", "lease", "--json", *pool, env=env)
    assert done.returncode == 0, done.stderr
    return [r["ended"] for r in json.loads(done.stdout)["leases"]]


def test_queue_times_on_an_embedded_pool(tmp_path: Path) -> None:
    check_queue_times(embedded_env(tmp_path, "emulated:1x16G"), tmp_path)


def test_queue_times_through_a_server(running_server, tmp_path: Path) -> None:
    import httpx

    env = running_server.client_env(tmp_path)
    pool = ("--server", running_server.url)
    check_queue_times(env, tmp_path, *pool)
    # A token bound to team-a claims there without naming it, and gets its default too.
    answer = httpx.post(
        f"{running_server.url}/v1/tokens", json={"name": "dana", "queue": "team-a"}, headers=running_server.headers()
    )
    assert answer.status_code == 201, answer.text
    dana = dict(env, GPUPOOL_TOKEN=answer.json()["token"])
    ran = gpupool("run", "-p", "0.5", *pool, "--", "sleep", "600", env=dana)
    assert ran.returncode == TimeLimit.exit_code, ran.stderr
    assert "(queue team-a's default)" in ran.stderr, ran.stderr


def test_a_default_above_the_max_is_one_line(tmp_path: Path) -> None:
    env = embedded_env(tmp_path, "emulated:1x16G")
    done = gpupool("queue", "set", "team-a", "--quota", "1", "--default-time", "2h", "--max-time", "1h", env=env)
    assert done.returncode == InvalidInput.exit_code, done.stderr
    assert "default time 2h is above its max time 1h" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    bad = gpupool("queue", "set", "team-a", "--quota", "1", "--max-time", "soon", env=env)
    assert bad.returncode == InvalidInput.exit_code and "--max-time 'soon'" in bad.stderr, bad.stderr
