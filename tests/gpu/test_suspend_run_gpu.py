"""On a real NVIDIA GPU, through the product: `gpupool run` trains on 70 % of the GPU (embedded
pool), `gpupool suspend` parks it mid-epoch, `gpupool run -p 0.9` then gets 90 % of the GPU and
finishes, `gpupool resume` brings the first back, and its loss curve equals an uninterrupted
run's, step for step (issue 28). Figures go to benchmarks/results/suspend-gpu-run.json.

Runs under pytest (`pytest -m gpu tests/gpu/test_suspend_run_gpu.py`) or as a script:
`PYTHONPATH=src python3 tests/gpu/test_suspend_run_gpu.py`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script
from envs import clean_env
from gpupool_cli import gpupool
from test_suspend_gpu import (
    BIG,
    HOLD_FRACTION,
    PAUSE_S,
    STEPS,
    SUSPEND_AFTER,
    TRAIN,
    first_difference,
    read_losses,
    skip_reason,
    smi_gpu,
    smi_text,
    wait_for_steps,
)

try:
    import pytest
except ImportError:  # run as a script on a GPU machine without the dev extras
    pytest = None  # type: ignore[assignment]

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "suspend-gpu-run.json"
RUN_FRACTION = "0.7"  # the training run's share: HOLD_FRACTION, a transient copy of it, the CUDA context
BIG_FRACTION = "0.9"
TOOK = re.compile(r"is (?:suspended|running) \(([0-9.]+) s\)")


def cli(state: Path, *args: str) -> subprocess.CompletedProcess:
    return gpupool(*args, env=run_env(state), timeout=600)


def run_env(state: Path) -> Dict[str, str]:
    """A clean environment on the pool in `state` (the real GPUs), deterministic cuBLAS."""
    return clean_env(GPUPOOL_STATE=str(state), CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1")


def train_run(state: Path, losses: Path, log: Path) -> subprocess.Popen:
    args = [str(losses), str(HOLD_FRACTION), str(STEPS), str(PAUSE_S)]
    command = ["run", "-n", "1", "-p", RUN_FRACTION, "--", sys.executable, "-c", TRAIN, *args]
    return subprocess.Popen(
        [sys.executable, "-m", "gpupool", *command],
        env=run_env(state),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def lease_id(state: Path) -> str:
    leases = json.loads(cli(state, "status", "--json").stdout)["leases"]
    assert len(leases) == 1, leases
    return str(leases[0]["id"])


def run_check(work: Path) -> Dict[str, Any]:
    state = work / "state"
    a_losses, b_losses = work / "a.losses", work / "b.losses"
    a = train_run(state, a_losses, work / "a.log")
    assert a.wait(600) == 0, (work / "a.log").read_text()[-3000:]

    b = train_run(state, b_losses, work / "b.log")
    wait_for_steps(b_losses, b, SUSPEND_AFTER)
    lease = lease_id(state)
    used_running = smi_gpu("memory.used")
    t0 = time.monotonic()
    suspended = cli(state, "suspend", lease, "--reason", "gpu check")
    suspend_wall_s = time.monotonic() - t0
    steps_at_suspend = len(b_losses.read_text().splitlines())
    used_parked = smi_gpu("memory.used")
    status = json.loads(cli(state, "status", "--json").stdout)

    t0 = time.monotonic()
    big = cli(state, "run", "-n", "1", "-p", BIG_FRACTION, "--", sys.executable, "-c", BIG, "0.85")
    big_s = time.monotonic() - t0

    t0 = time.monotonic()
    resumed = cli(state, "resume", lease)
    resume_wall_s = time.monotonic() - t0
    b_exit = b.wait(600)
    took = [float(m) for m in TOOK.findall(suspended.stderr + resumed.stderr)]
    return {
        "a": read_losses(a_losses),
        "b": read_losses(b_losses),
        "a_exit": 0,
        "b_exit": b_exit,
        "b_log": (work / "b.log").read_text()[-3000:],
        "gpu": smi_text("name"),
        "driver": smi_text("driver_version"),
        "suspend_exit": suspended.returncode,
        "suspend_out": suspended.stderr[-2000:],
        "resume_exit": resumed.returncode,
        "resume_out": resumed.stderr[-2000:],
        "lease_state_while_parked": status["leases"][0]["state"],
        "host_bytes": status["leases"][0]["suspension"]["host_bytes"],
        "used_mib_running": used_running,
        "used_mib_parked": used_parked,
        "steps_at_suspend": steps_at_suspend,
        "suspend_s": took[0] if took else None,
        "resume_s": took[1] if len(took) > 1 else None,
        "suspend_wall_s": round(suspend_wall_s, 3),
        "resume_wall_s": round(resume_wall_s, 3),
        "big_exit": big.returncode,
        "big_out": (big.stdout + big.stderr)[-2000:],
        "big_s": round(big_s, 3),
    }


def check(result: Dict[str, Any]) -> None:
    assert result["suspend_exit"] == 0, result["suspend_out"]
    assert result["lease_state_while_parked"] == "suspended", result
    assert result["big_exit"] == 0, (
        f"`gpupool run -p {BIG_FRACTION}` failed while the run was parked: {result['big_out']}"
    )
    assert result["resume_exit"] == 0, result["resume_out"]
    assert result["b_exit"] == 0, result["b_log"]
    assert SUSPEND_AFTER <= result["steps_at_suspend"] < STEPS, result
    a, b = result["a"], result["b"]
    assert len(a) == len(b) == STEPS and a == b, first_difference(a, b)


def record(result: Dict[str, Any]) -> None:
    kept = {k: v for k, v in result.items() if k not in ("a", "b")}
    kept["losses_equal"] = result["a"] == result["b"]
    kept["steps"] = len(result["b"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(kept, indent=2) + "\n")


if pytest is not None:
    pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "ok")]

    def test_a_run_suspended_with_the_cli_gives_its_gpu_away_and_ends_as_if_never_stopped(tmp_path: Path) -> None:
        result = run_check(tmp_path)
        record(result)
        check(result)


if __name__ == "__main__":
    if skip_reason():
        sys.exit(f"skipped: {skip_reason()}")
    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_check(Path(tmp))
        record(outcome)
        check(outcome)
        print(json.dumps({k: v for k, v in outcome.items() if k not in ("a", "b")}, indent=2))
