"""On a real NVIDIA GPU: a training run suspended mid-epoch gives its GPU to another job and then
ends with the same loss curve, step for step, as an uninterrupted run (issue 28).

The run (a small convnet on fixed synthetic data, fixed seeds, deterministic kernels, no TF32)
also holds HOLD_FRACTION of the GPU's memory, so the second job's BIG_FRACTION fits only while
the run is parked. Skipped where torch sees no CUDA device or the driver has no checkpoint API.
Figures go to benchmarks/results/suspend-gpu-training.json.

Runs under pytest (`pytest -m gpu tests/gpu/test_suspend_gpu.py`) or, where pytest is not
installed, as a script: `PYTHONPATH=src python3 tests/gpu/test_suspend_gpu.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script
from waiting import wait_until

from gpupool.pooling.isolation.parking import backend_named, cuda_unavailable_reason

try:
    import pytest
except ImportError:  # run as a script on a GPU machine without the dev extras
    pytest = None  # type: ignore[assignment]

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "suspend-gpu-training.json"
STEPS = 200
SUSPEND_AFTER = 85  # steps done when the run is suspended: 16 steps an epoch, so mid-epoch (the 6th)
HOLD_FRACTION = 0.30
BIG_FRACTION = 0.90
PAUSE_S = 0.02  # per step, so the suspend lands mid-run however fast the GPU is; no effect on the losses

TRAIN = r"""
import os, sys, time, torch
import torch.nn as nn, torch.nn.functional as F
losses, hold_fraction, steps, pause = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
torch.manual_seed(0)
torch.use_deterministic_algorithms(True, warn_only=True)  # a warning names any op that is not
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
total = torch.cuda.get_device_properties(0).total_memory
hold = torch.full((int(total * hold_fraction),), 7, dtype=torch.uint8, device=dev)
data = torch.Generator().manual_seed(1)
x = torch.randn(1024, 3, 32, 32, generator=data).to(dev)
y = torch.randint(0, 10, (1024,), generator=data).to(dev)
# Strided convolutions, no pooling: every kernel of the step has a deterministic CUDA implementation.
model = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
    nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
    nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
    nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
shuffle = torch.Generator().manual_seed(2)
batch, per_epoch = 64, 1024 // 64
with open(losses, "w") as out:
    for step in range(steps):
        if step % per_epoch == 0:
            order = torch.randperm(1024, generator=shuffle).to(dev)
        idx = order[(step % per_epoch) * batch : (step % per_epoch + 1) * batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.write(f"{step} {loss.item()!r}\n")
        out.flush()
        time.sleep(pause)
assert bool((hold == 7).all()), "the held buffer changed"
print("done", flush=True)
"""

BIG = r"""
import sys, torch
total = torch.cuda.get_device_properties(0).total_memory
block = torch.empty(int(total * float(sys.argv[1])), dtype=torch.uint8, device="cuda")
block.fill_(1)
torch.cuda.synchronize()
print("allocated", block.numel(), flush=True)
"""


def smi_text(field: str) -> str:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def smi_gpu(field: str) -> int:
    return int(smi_text(field).split()[0])


def train(losses: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", CUDA_VISIBLE_DEVICES="0")
    args = [str(losses), str(HOLD_FRACTION), str(STEPS), str(PAUSE_S)]
    return subprocess.Popen(
        [sys.executable, "-c", TRAIN, *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def read_losses(path: Path) -> List[Tuple[int, float]]:
    rows = []
    for line in path.read_text().splitlines():
        step, value = line.split()
        rows.append((int(step), float(value)))
    return rows


def wait_for_steps(path: Path, proc: subprocess.Popen, steps: int, timeout: float = 300) -> None:
    """Wait until the run wrote `steps` loss lines to `path`; fails at once if it ends first."""

    def reached() -> bool:
        if path.exists() and len(path.read_text().splitlines()) >= steps:
            return True
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before step {steps}"
        return False

    wait_until(reached, timeout, f"step {steps} in {path}", interval=0.005)


def run_check(work: Path) -> Dict[str, Any]:
    """Run A uninterrupted, run B suspended mid-epoch while a 90 % job runs; what each gave."""
    a_losses, b_losses = work / "a.losses", work / "b.losses"
    a = train(a_losses, work / "a.log")
    assert a.wait(600) == 0, (work / "a.log").read_text()[-3000:]

    total_mib = smi_gpu("memory.total")
    backend = backend_named("cuda")
    b = train(b_losses, work / "b.log")
    wait_for_steps(b_losses, b, SUSPEND_AFTER)
    used_running = smi_gpu("memory.used")
    t0 = time.monotonic()
    parked = backend.suspend([b.pid], lock_timeout_s=60)
    suspend_s = time.monotonic() - t0
    steps_at_suspend = len(b_losses.read_text().splitlines())
    used_parked = smi_gpu("memory.used")
    time.sleep(1)
    frozen = len(b_losses.read_text().splitlines()) == steps_at_suspend

    t0 = time.monotonic()
    big = subprocess.run(
        [sys.executable, "-c", BIG, str(BIG_FRACTION)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"),
    )
    big_s = time.monotonic() - t0

    t0 = time.monotonic()
    backend.resume(parked, {})
    resume_s = time.monotonic() - t0
    b_exit = b.wait(600)
    log_b = (work / "b.log").read_text()
    return {
        "a": read_losses(a_losses),
        "b": read_losses(b_losses),
        "b_exit": b_exit,
        "b_log": log_b[-3000:],
        "deterministic_warnings": "deterministic" in log_b and "UserWarning" in log_b,
        "gpu": smi_text("name"),
        "driver": smi_text("driver_version"),
        "gpu_memory_mib": total_mib,
        "used_mib_running": used_running,
        "used_mib_parked": used_parked,
        # The premise: with run B on the GPU, the big job could not have fit.
        "big_fits_beside_running_b": used_running + BIG_FRACTION * total_mib <= total_mib,
        "steps_at_suspend": steps_at_suspend,
        "frozen_while_parked": frozen,
        "host_bytes": parked.host_bytes,
        "suspend_s": round(suspend_s, 3),
        "resume_s": round(resume_s, 3),
        "big_exit": big.returncode,
        "big_out": (big.stdout + big.stderr)[-2000:],
        "big_s": round(big_s, 3),
    }


def first_difference(a: List[Tuple[int, float]], b: List[Tuple[int, float]]) -> str:
    for (step, x), (_, y) in zip(a, b):
        if x != y:
            return f"step {step}: {x!r} uninterrupted vs {y!r} suspended (|diff| {abs(x - y):.3g})"
    return f"{len(a)} vs {len(b)} steps"


def check(result: Dict[str, Any]) -> None:
    assert not result["big_fits_beside_running_b"], result  # else the test proves nothing
    assert SUSPEND_AFTER <= result["steps_at_suspend"] < STEPS, result
    assert result["frozen_while_parked"], "the run went on stepping while parked"
    assert result["big_exit"] == 0, f"the {BIG_FRACTION:.0%} job failed while the run was parked: {result['big_out']}"
    assert result["b_exit"] == 0, result["b_log"]
    a, b = result["a"], result["b"]
    assert len(a) == len(b) == STEPS
    assert a == b, first_difference(a, b) + (
        " (torch warned of a nondeterministic op)" * result["deterministic_warnings"]
    )


def record(result: Dict[str, Any]) -> None:
    figures = {k: v for k, v in result.items() if k not in ("a", "b", "b_log", "big_out")}
    figures.update(
        steps=STEPS,
        losses_equal_step_for_step=result["a"] == result["b"],
        first_loss=result["a"][0][1] if result["a"] else None,
        last_loss=result["a"][-1][1] if result["a"] else None,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


def skip_reason() -> str:
    """Why this machine cannot run the GPU checks of suspension ('' when it can)."""
    try:
        import torch
    except ImportError:
        return "needs torch"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    return cuda_unavailable_reason() or ""


if pytest is not None:
    pytestmark = [pytest.mark.gpu, pytest.mark.slow]

    def test_a_run_suspended_mid_epoch_ends_with_the_same_losses(tmp_path: Path) -> None:
        reason = skip_reason()
        if reason:
            pytest.skip(reason)
        result = run_check(tmp_path)
        record(result)
        check(result)


if __name__ == "__main__":
    why = skip_reason()
    if why:
        sys.exit(f"skipped: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_check(Path(tmp))
    record(outcome)
    print(json.dumps({k: v for k, v in outcome.items() if k not in ("a", "b")}, indent=1))
    check(outcome)
    print(f"PASS: {STEPS} losses equal step for step; suspend {outcome['suspend_s']} s, resume {outcome['resume_s']} s")
