"""On a real NVIDIA GPU: the share really holds (hooks and MPS), and two jobs really share one GPU.

Skipped where torch sees no CUDA device (CI has none); `make gpu-check` runs
`pytest -m gpu tests/gpu` on a GPU machine and the figures (among them the CUDA
context overhead per process, to set CONTEXT_RESERVE_MIB /
GPUPOOL_CONTEXT_RESERVE_MIB from) go to benchmarks/results/gpu-isolation.json.
The watchdog and killed-runner checks live in test_enforcement_gpu.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

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


def gpupool_run(
    state: Path, fraction: float, *child_args: str, wait: str = "0", child: str = CHILD
) -> subprocess.Popen:
    env = dict(os.environ, GPUPOOL_STATE=str(state))
    env.pop("GPUPOOL_DEVICES", None)  # the real GPUs, through NVML
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpupool",
            "run",
            "-n",
            "1",
            "-p",
            str(fraction),
            "--wait",
            wait,
            "--",
            sys.executable,
            "-c",
            child,
            *child_args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
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


# ---------------------------------------------------------------------------------------------
# Isolation modes and the CUDA context reserve (figures: benchmarks/results/gpu-isolation.json)
# ---------------------------------------------------------------------------------------------

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu-isolation.json"
MIB = 1 << 20

# MPS over-share: undo the hook's torch cap first, so only the MPS server's limit can stop it.
CHILD_NO_HOOK_CAP = CHILD.replace(
    "fraction = float(sys.argv[1])",
    "fraction = float(sys.argv[1])\ntorch.cuda.set_per_process_memory_fraction(1.0, 0)",
)

# Fills the allocator cap the hook set, in 64 MiB blocks, holds it, then runs a kernel on what is held.
FILL = r"""
import json, os, sys, time, torch
blocks = []
try:
    while True:
        blocks.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
torch.cuda.synchronize()
blocks[0].add_(1)  # a kernel still runs with the cap full: the context had its room
torch.cuda.synchronize()
out = {"visible": os.environ["CUDA_VISIBLE_DEVICES"], "filled_mib": 64 * len(blocks),
       "cap_mib": int(os.environ["GPUPOOL_ALLOCATOR_LIMIT_MIB"].split(",")[0])}
open(sys.argv[1], "w").write("held")
while not os.path.exists(sys.argv[1] + ".go"):
    time.sleep(0.05)
print(json.dumps(out))
"""

# The CUDA context's device memory outside the caching allocator: used after init minus reserved.
CONTEXT = r"""
import json, torch
torch.cuda.init()
x = torch.ones(1024, 1024, device="cuda")
(x @ x).sum().item()  # loads cuBLAS, as a training step would
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info(0)
print(json.dumps({"total": total, "free": free, "reserved": torch.cuda.memory_reserved(0)}))
"""


@pytest.fixture(scope="module")
def figures() -> Iterator[Dict[str, Any]]:
    """What the tests measured; written to RESULTS (merged with earlier runs) when the module ends."""
    found: Dict[str, Any] = {}
    yield found
    if not found:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.update(found)
    data["device"] = torch.cuda.get_device_name(0)
    data["torch"] = torch.__version__
    data["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def device_used_mib() -> Optional[int]:
    """MiB in use on GPU 0 by every process (NVML), or None without pynvml."""
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        # v2: "used" without the driver's own reserve, which CUDA's total already leaves out
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0), version=pynvml.nvmlMemory_v2)
        return int(info.used) // MIB
    finally:
        pynvml.nvmlShutdown()


def test_cuda_context_overhead_per_process(figures):
    """Measures the figure CONTEXT_RESERVE_MIB estimates (isolation/env.py)."""
    from gpupool.pooling.isolation.env import CONTEXT_RESERVE_MIB

    before = device_used_mib()
    done = subprocess.run(
        [sys.executable, "-c", CONTEXT],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    used = (seen["total"] - seen["free"]) // MIB
    context = used - seen["reserved"] // MIB - (before or 0)
    figures["context_overhead_mib"] = context
    figures["context_overhead_note"] = "device used after torch init + one matmul, minus allocator reserved" + (
        ", minus what other processes used before"
        if before is not None
        else " (other processes not subtracted: no pynvml)"
    )
    figures["context_reserve_mib_default"] = CONTEXT_RESERVE_MIB
    figures["context_reserve_mib_suggested"] = int(math.ceil(context / 64.0) * 64 + 64)
    assert 0 < context < 4096, seen


def test_hooks_mode_over_share_fails(tmp_path, figures):
    over = result(gpupool_run(tmp_path / "state", 0.25, "0.3"))
    assert over["allocated"] is False, over
    figures["hooks_over_share_refused"] = True


def test_two_half_shares_that_fill_their_caps_run_at_once(tmp_path, figures):
    state = tmp_path / "state"
    flags = [tmp_path / "a", tmp_path / "b"]
    jobs = [gpupool_run(state, 0.5, str(flag), child=FILL) for flag in flags]
    try:
        for flag in flags:
            for _ in range(1200):
                if flag.exists() or any(j.poll() is not None for j in jobs):
                    break
                time.sleep(0.1)
            assert flag.exists(), "a job never filled its cap: " + "".join(
                j.stderr.read() for j in jobs if j.poll() is not None and j.stderr
            )
    finally:
        for flag in flags:
            Path(str(flag) + ".go").write_text("")
    first, second = (result(j) for j in jobs)
    assert first["visible"] == second["visible"], "both shares should be on the one GPU (binpack)"
    for job in (first, second):
        assert job["filled_mib"] >= job["cap_mib"] * 0.9, job
    figures["two_half_shares_filled_mib"] = [first["filled_mib"], second["filled_mib"]]
    figures["two_half_shares_cap_mib"] = first["cap_mib"]


@pytest.fixture
def mps_pool(tmp_path) -> Iterator[Path]:
    """A state dir whose pool is in MPS mode, with its control daemon running; skips where MPS cannot start."""
    from gpupool.core.errors import GpupoolError
    from gpupool.pooling.isolation.mps import MpsDaemon
    from gpupool.pooling.pool.service import Pool

    state = tmp_path / "state"
    daemon = MpsDaemon(state)
    try:
        isolation = daemon.start()
    except GpupoolError as err:  # MpsUnavailable (no binary) or Unavailable (did not start)
        pytest.skip(f"MPS: {err.message}")
    saved = os.environ.pop("GPUPOOL_DEVICES", None)
    try:
        pool = Pool.open(state)
        try:
            pool.set_isolation(isolation)
        finally:
            pool.close()
        yield state
    finally:
        if saved is not None:
            os.environ["GPUPOOL_DEVICES"] = saved
        daemon.stop()


def test_mps_mode_over_share_fails_without_the_hook(mps_pool, figures):
    over = result(gpupool_run(mps_pool, 0.25, "0.4", child=CHILD_NO_HOOK_CAP))
    assert over["allocated"] is False, over  # the MPS server's pinned memory limit, not torch's cap
    under = result(gpupool_run(mps_pool, 0.25, "0.15", child=CHILD_NO_HOOK_CAP))
    assert under["allocated"] is True, under
    figures["mps_over_share_refused"] = True
