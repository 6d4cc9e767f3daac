"""On a real NVIDIA GPU: the share really holds, and two jobs really share one GPU.

Skipped where torch sees no CUDA device (CI has none); run with `pytest -m gpu`
on a GPU machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# The child allocates `fraction` of the GPU's memory and prints what happened.
CHILD = r"""
import json, os, sys, time, torch
fraction = float(sys.argv[1])
total = torch.cuda.get_device_properties(0).total_memory
out = {"visible": os.environ["CUDA_VISIBLE_DEVICES"], "total": total}
try:
    block = torch.empty(int(total * fraction), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    out["allocated"] = True
    if len(sys.argv) > 2:  # hold the memory until told to go
        open(sys.argv[2], "w").write("held")
        while not os.path.exists(sys.argv[2] + ".go"):
            time.sleep(0.05)
except torch.OutOfMemoryError as err:
    out["allocated"] = False
    out["error"] = str(err).splitlines()[0]
print(json.dumps(out))
"""


def gpupool_run(state: Path, fraction: float, *child_args: str, wait: str = "0") -> subprocess.Popen:
    env = dict(os.environ, GPUPOOL_STATE=str(state))
    env.pop("GPUPOOL_DEVICES", None)  # the real GPUs, through NVML
    return subprocess.Popen(
        [sys.executable, "-m", "gpupool", "run", "-n", "1", "-p", str(fraction), "--wait", wait,
         "--", sys.executable, "-c", CHILD, *child_args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_a_quarter_share_cannot_allocate_half_the_gpu(tmp_path):
    over = result(gpupool_run(tmp_path / "state", 0.25, "0.5"))
    assert over["allocated"] is False, over
    under = result(gpupool_run(tmp_path / "state", 0.25, "0.15"))
    assert under["allocated"] is True, under


def test_two_half_shares_run_at_once_on_one_gpu(tmp_path):
    state = tmp_path / "state"
    flags = [tmp_path / "a", tmp_path / "b"]
    jobs = [gpupool_run(state, 0.5, "0.4", str(flag)) for flag in flags]
    try:
        for flag in flags:  # both hold 40 % of the same GPU at the same time
            for _ in range(600):
                if flag.exists() or any(j.poll() is not None for j in jobs):
                    break
                time.sleep(0.1)
            assert flag.exists(), "a job never got to allocate its share"
    finally:
        for flag in flags:
            Path(str(flag) + ".go").write_text("")
    first, second = (result(j) for j in jobs)
    assert first["allocated"] and second["allocated"]
    assert first["visible"] == second["visible"], "both shares should be on the one GPU (binpack)"
