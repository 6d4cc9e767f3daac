"""gpupool-run.pyz: built from the tree, run by a bare Python (no venv, no site-packages, empty env)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from envs import embedded_env
from workload_imports import EMBEDDED_NEVER

ROOT = Path(__file__).resolve().parents[2]
BARE = [
    p for p in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3") or "") if p and os.path.exists(p)
]
# The oldest Python the workload side supports, where this machine has one (pyenv, deadsnakes).
OLDEST = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")) + glob.glob("/usr/bin/python3.9"))


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("dist") / "gpupool-run.pyz"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_pyz.py"), str(target)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return target


def test_archive_holds_only_the_workload_side(pyz):
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert os.access(pyz, os.X_OK)
    names = zipfile.ZipFile(pyz).namelist()
    assert "__main__.py" in names
    assert "gpupool/pooling/isolation/hook/sitecustomize.py" in names
    assert "gpupool/cli/run.py" in names and "gpupool/pooling/pool/service.py" in names
    assert not any(n.startswith(("gpupool/serving/server/", "gpupool/kube/", "gpupool/train/")) for n in names)
    # Bytecode beside every module (for the Python that built it; others fall back to the source).
    assert {n + "c" for n in names if n.endswith(".py")} <= set(names)
    # and nothing else: no table of generated code beside the bytecode (issue 24)
    assert not [n for n in names if "__pycache__" in n]


@pytest.mark.parametrize("python", (BARE[:1] + OLDEST[:1]) or [None])
def test_runs_under_a_bare_python_without_the_venv(pyz, tmp_path, python):
    if python is None:
        pytest.skip("no system python3")
    env = {
        "PATH": "/usr/bin:/bin",
        "GPUPOOL_STATE": str(tmp_path / "state"),
        "GPUPOOL_DEVICES": "emulated:1x16GiB",
        "HOME": str(tmp_path),
    }
    record = tmp_path / "env.json"
    child = f"import json, os; json.dump(dict(os.environ), open({str(record)!r}, 'w'))"
    done = subprocess.run(
        [python, "-I", str(pyz), "run", "-n", "1", "-p", "0.5", "--", python, "-c", child],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(record.read_text())
    assert seen["CUDA_VISIBLE_DEVICES"].startswith("GPU-emu-")
    assert seen["GPUPOOL_MEMORY_FRACTION"] == "0.5"
    status = subprocess.run(
        [python, "-I", str(pyz), "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert json.loads(status.stdout)["leases"] == []
    bad = subprocess.run(
        [python, "-I", str(pyz), "run", "-p", "2", "--", "true"], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "outside (0, 1]" in bad.stderr


def test_runs_as_an_executable_via_its_shebang(pyz, tmp_path):
    env = embedded_env(tmp_path, "emulated:1x8GiB")
    done = subprocess.run(
        [str(pyz), "run", "-q", "-m", "1GiB", "--", "sh", "-c", "exit 7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 7, done.stderr


def test_a_run_through_the_zipapp_imports_none_of_what_the_install_never_imports(pyz, tmp_path):
    """The zipapp starts as light as the install: `python -X importtime` lists every module imported."""
    env = embedded_env(tmp_path, "emulated:1x8GiB")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(pyz), "run", "-q", "-p", "0.5", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "gpupool.workload.runner.session" in imported  # the listing is the run's
    assert imported & set(EMBEDDED_NEVER) == set()
