"""`gpupool run --isolation`: the embedded pool's mode, recorded in its state and applied to each child."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HOLDER = str(Path(__file__).with_name("holder.py"))


def child_env(pool, tmp_path: Path, *flags: str) -> dict:
    record = tmp_path / f"env-{len(list(tmp_path.iterdir()))}.json"
    done = pool.run("run", "-q", *flags, "-p", "0.5", "--", sys.executable, HOLDER, str(record))
    assert done.returncode == 0, done.stderr
    return json.loads(record.read_text())["env"]


def test_mode_none_drops_the_hook_and_is_kept_by_the_pool(pool, tmp_path):
    assert "GPUPOOL_HOOK_DIR" in child_env(pool, tmp_path)  # a new pool: hooks
    bare = child_env(pool, tmp_path, "--isolation", "none")
    assert "GPUPOOL_HOOK_DIR" not in bare and "GPUPOOL_MEMORY_LIMIT_MIB" not in bare
    assert bare["CUDA_VISIBLE_DEVICES"] and bare["GPUPOOL_LEASE_ID"]
    assert pool.status()["isolation"]["mode"] == "none"
    assert "GPUPOOL_HOOK_DIR" not in child_env(pool, tmp_path), "the pool keeps its mode for later runs"
    assert "GPUPOOL_HOOK_DIR" in child_env(pool, tmp_path, "--isolation", "hooks")


def test_mps_without_the_binary_exits_2_naming_it(pool, tmp_path):
    env = dict(pool.env, PATH=str(tmp_path))  # no nvidia-cuda-mps-control here
    env["PATH"] = os.pathsep.join([str(tmp_path), os.path.dirname(sys.executable)])
    done = pool.run("run", "--isolation", "mps", "-p", "0.5", "--", "true", env=env)
    assert done.returncode == 2 and "nvidia-cuda-mps-control" in done.stderr and "Traceback" not in done.stderr
    assert pool.status()["leases"] == []


def test_isolation_with_a_server_is_refused(pool):
    done = pool.run("run", "--isolation", "hooks", "--server", "http://127.0.0.1:9", "-p", "0.5", "--", "true")
    assert done.returncode == 2 and "embedded pool only" in done.stderr
