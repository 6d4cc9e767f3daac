"""TensorFlow for real: the generated TF_CONFIG drives MultiWorkerMirroredStrategy and
ParameterServerStrategy jobs on CPU (CI installs tensorflow-cpu; skipped without it)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from .conftest import REPO

# Only look for TensorFlow here: importing it into the test process (which also
# loads torch) can crash; the jobs import it in their own processes.
pytestmark = [
    pytest.mark.tensorflow,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow-cpu"),
]


def run_example(shell, name: str) -> dict:
    shutil.copytree(REPO / "examples", shell.state / "examples")
    proc = shell.run("submit", f"examples/{name}.yaml", "--follow", check=False, timeout=240)
    st = shell.state_of(name)
    assert st["status"] == "Succeeded", proc.stdout[-3000:] + proc.stderr
    results = shell.state / "jobs" / name / "results"
    assert shell.leases() == []
    return {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}


def test_multi_worker_mirrored_two_workers(shell):
    results = run_example(shell, "tf-mwms")
    assert set(results) == {"worker-0", "worker-1"}
    a, b = results["worker-0"], results["worker-1"]
    assert a["steps"] == b["steps"] == 20
    assert a["replicas_in_sync"] == b["replicas_in_sync"] == 2
    assert a["weights"] == b["weights"]  # all-reduced updates: both workers hold the same model


def test_parameter_server_strategy(shell):
    results = run_example(shell, "tf-ps")
    assert results["chief-0"]["steps"] == 20 and results["chief-0"]["workers"] == 2
    st = shell.state_of("tf-ps")
    # The servers were stopped once the chief was done.
    assert {r["status"] for n, r in st["replicas"].items() if n != "chief-0"} <= {"Stopped", "Failed", "Succeeded"}
