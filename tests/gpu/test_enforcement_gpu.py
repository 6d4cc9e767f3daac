"""On a real NVIDIA GPU: the watchdog stops a job that bypasses the hooks, and a killed runner leaves nothing.

Runs on the embedded pool (no FastAPI needed on the GPU machine): the test process
runs the same `Watchdog` the server runs, on the state dir the `gpupool run`s use.
Figures go to benchmarks/results/gpu-enforcement.json. Skipped without NVML and a GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict

import pytest
from waiting import wait_until

pynvml = pytest.importorskip("pynvml")
pytestmark = pytest.mark.gpu

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu-enforcement.json"

# Allocates `fraction` of GPU 0 through the CUDA driver API (ctypes): no torch, no hook can cap it.
BYPASS = r"""
import ctypes, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed: CUresult {rc}")
check(cuda.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
free, total = ctypes.c_size_t(), ctypes.c_size_t()
check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
ptr = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(total.value * float(sys.argv[1])))), "cuMemAlloc")
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(600)
"""


def _nvml_ready() -> bool:
    try:
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


if not _nvml_ready():
    pytest.skip("needs NVML and an NVIDIA GPU", allow_module_level=True)


def record(name: str, figures: Dict[str, Any]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[name] = dict(figures, gpu=pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)), at=time.time())
    RESULTS.write_text(json.dumps(data, indent=2, default=str))


def run(state: Path, fraction: float, *command: str) -> subprocess.Popen:
    env = dict(os.environ, GPUPOOL_STATE=str(state))
    env.pop("GPUPOOL_DEVICES", None)
    return subprocess.Popen(
        [sys.executable, "-m", "gpupool", "run", "-n", "1", "-p", str(fraction), "--ttl", "30", "--", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 120) -> str:
    """What the runner's child wrote to `path`, once it wrote something; fails at once if the runner ends."""

    def written() -> str:
        text = path.read_text() if path.exists() else ""
        if not text and proc.poll() is not None:
            raise AssertionError(f"runner ended early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        return text

    return wait_until(written, timeout, f"{path} to appear", interval=0.1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_watchdog_stops_a_driver_api_job_over_its_share(tmp_path):
    from gpupool.core.usage import EnforceMode
    from gpupool.pooling.isolation.evidence import Witness, start_ticks
    from gpupool.pooling.pool import Pool
    from gpupool.serving.enforcement import Attributor, Watchdog, WatchdogConfig
    from gpupool.serving.enforcement.attest import Attestations

    state = tmp_path / "state"
    marker = tmp_path / "pid"
    runner = run(state, 0.25, sys.executable, "-c", BYPASS, "0.5", str(marker))
    pool = None
    dog = None
    try:
        pid = int(wait_for_file(marker, runner))
        pool = Pool(state)
        grace = 1.0
        # The node's evidence: the runner is this process's own child (an embedded pool has no attestation socket).
        (lease,) = pool.status().leases
        attested = Attestations()
        attested.add(lease.id, Witness(runner.pid, start_ticks(runner.pid) or 0, os.getuid()))
        dog = Watchdog(
            pool,
            WatchdogConfig(interval_s=0.5, grace_s=grace, over_share=EnforceMode.KILL),
            attributor=Attributor(attested),
        )
        seen = dog.step()
        mine = [p for p in seen.processes if p.lease_id]
        started = time.monotonic()
        dog.start()
        while alive(pid) and time.monotonic() - started < grace + 10:
            time.sleep(0.1)
        stopped_after = time.monotonic() - started
        assert not alive(pid), "the over-share process is still running"
        code = runner.wait(timeout=30)
        record(
            "watchdog_over_share",
            {
                "attributed_mib": sum(p.memory_mib for p in mine),
                "stopped_after_s": round(stopped_after, 2),
                "grace_s": grace,
                "runner_exit": code,
                "processes_seen": len(seen.processes),
            },
        )
        assert mine, f"NVML showed no process of the lease: {seen.processes}"
    finally:
        if dog is not None:
            dog.stop()
        if pool is not None:
            pool.close()
        runner.kill()
        runner.wait()


def test_a_killed_runner_leaves_no_process_on_the_gpu(tmp_path):
    marker = tmp_path / "pid"
    runner = run(tmp_path / "state", 0.25, sys.executable, "-c", BYPASS, "0.1", str(marker))
    try:
        pid = int(wait_for_file(marker, runner))
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        before = len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        runner.send_signal(signal.SIGKILL)
        started = time.monotonic()
        while alive(pid) and time.monotonic() - started < 5:
            time.sleep(0.05)
        gone_after = time.monotonic() - started
        time.sleep(0.5)  # the driver frees the context after the process is reaped
        after = len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        record(
            "killed_runner",
            {"child_gone_after_s": round(gone_after, 2), "gpu_processes_before": before, "gpu_processes_after": after},
        )
        assert not alive(pid) and gone_after <= 2.0
        assert after < before or before == 0  # in a container NVML may list no pids at all
    finally:
        runner.kill()
        runner.wait()
