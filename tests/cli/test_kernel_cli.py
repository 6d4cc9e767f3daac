"""`gpupool kernel install/list/remove`: the kernelspec written, and one-line errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")


def kernel(env: Dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpupool", "kernel", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def env(tmp_path: Path) -> Dict[str, str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "GPUPOOL_"))}
    return dict(base, JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_PATH=str(tmp_path / "data"))


def test_install_list_remove(env: Dict[str, str], tmp_path: Path) -> None:
    done = kernel(env, "install", "gpu-quarter", "--fraction", "0.25", "--queue", "team-a", "--idle-suspend", "5m")
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "data" / "kernels" / "gpu-quarter" / "kernel.json").read_text())
    assert spec["argv"][-1] == "{connection_file}" and spec["language"] == "python"
    assert "supported_encryption" not in spec["metadata"], "the proxy relays plain ZeroMQ"
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "gpupool-provisioner",
        "config": {
            "kernel_name": "gpu-quarter",
            "fraction": 0.25,
            "memory_mib": None,
            "queue": "team-a",
            "idle_suspend_s": 300.0,
            "server": "",
        },
    }
    assert kernel(env, "install", "big", "--memory", "8GiB", "--idle-suspend", "never").returncode == 0
    listed = kernel(env, "list").stdout.splitlines()
    assert [line.split("\t")[0] for line in listed] == ["big", "gpu-quarter"]
    assert "8192 MiB GPU" in listed[0] and "idle suspend never" in listed[0]
    wraps_ours = kernel(env, "install", "again", "--kernel", "gpu-quarter")
    assert wraps_ours.returncode == 2 and "a gpupool kernel already" in wraps_ours.stderr
    assert kernel(env, "remove", "big").returncode == 0
    assert [line.split("\t")[0] for line in kernel(env, "list").stdout.splitlines()] == ["gpu-quarter"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["install", "a/b", "-p", "0.5"], "kernel name"),
        (["install", "k", "-p", "1.5"], "--fraction"),
        (["install", "k", "-m", "lots"], "--memory"),
        (["install", "k", "--idle-suspend", "soon"], "--idle-suspend"),
        (["install", "k", "--queue", "Team A"], "queue name"),
        (["install", "k", "--server", "ftp://x"], "--server"),
        (["install", "k", "--kernel", "nope"], "no kernel 'nope'"),
        (["install", "python3"], "cannot wrap itself"),
        (["remove", "python3"], "no gpupool kernel"),
    ],
)
def test_hostile_input_gives_one_line(env: Dict[str, str], args: list, words: str) -> None:
    done = kernel(env, *args)
    assert done.returncode in (2, 4), done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
