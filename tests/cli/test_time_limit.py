"""Issue 36 item 3: `gpupool run --time DURATION`, as Slurm's --time, through the real CLI: past its
limit the command's whole tree is ended (a daemon it left in the background too), the run exits
TimeLimit.exit_code with a line saying so, and the lease history says `timeout`; a run that ends in
time is untouched; a bad duration is one line (exit 2). On an embedded pool and through a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import pytest
from envs import embedded_env
from gpupool_cli import gpupool
from waiting import wait_until

from gpupool.core.errors import InvalidInput, TimeLimit


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def history(env: Dict[str, str], *argv: str) -> List[dict]:
    done = gpupool("usage", "--by", "lease", "--json", *argv, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["leases"]


def check_time_limit(env: Dict[str, str], tmp_path: Path, *pool: str) -> None:
    pidfile = tmp_path / "daemon.pid"
    script = f"sleep 600 & echo $! > {pidfile}; wait"
    done = gpupool("run", *pool, "-p", "0.5", "--time", "2s", "--", "sh", "-c", script, env=env)
    assert done.returncode == TimeLimit.exit_code, done.stderr
    assert "time limit 2s reached (--time): ending the command" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    daemon = int(pidfile.read_text())
    wait_until(lambda: not alive(daemon), 30, "the background sleep ended with the tree")
    ended = history(env, *pool)
    assert [r["ended"] for r in ended] == ["timeout"], ended
    assert [r["ended"] for r in history(env, *pool, "--states", "timeout")] == ["timeout"]

    quick = gpupool("run", *pool, "-q", "-p", "0.5", "--time", "10m", "--", "true", env=env)
    assert quick.returncode == 0, quick.stderr
    assert [r["ended"] for r in history(env, *pool)] == ["timeout", "released"]


def test_time_limit_on_an_embedded_pool(tmp_path: Path) -> None:
    check_time_limit(embedded_env(tmp_path, "emulated:1x16G"), tmp_path)


def test_time_limit_through_a_server(running_server, tmp_path: Path) -> None:
    check_time_limit(running_server.client_env(tmp_path), tmp_path, "--server", running_server.url)


@pytest.mark.parametrize("value", ["0", "abc", "-5m", "nan", "400d"])
def test_a_bad_time_limit_is_one_line(tmp_path: Path, value: str) -> None:
    done = gpupool("run", f"--time={value}", "--", "true", env=embedded_env(tmp_path, "emulated:1x16G"))
    assert done.returncode == InvalidInput.exit_code, done.stderr
    assert done.stderr.count("\n") == 1 and f"--time {value!r}" in done.stderr, done.stderr
