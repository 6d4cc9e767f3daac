"""On a real NVIDIA GPU (issue 29): a gpupool kernel holding a 4 GiB tensor goes idle and its lease
is suspended (the driver parks the tensor in host memory); another kernel then fills the GPU and
ends; the first kernel's next cell resumes the lease and sums the same tensor to the same value.
The seconds from that cell's start to its result go to benchmarks/results/notebook-gpu.json.

`PYTHONPATH=src python3 -m pytest -m gpu tests/gpu/test_notebook_gpu.py` (embedded pool; needs
torch, jupyter_client, ipykernel, pyzmq and the cuda suspend backend). Where gpupool is not
pip-installed, the provisioner's entry point is declared from a dist-info folder put on the path.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from gpupool.pooling.isolation.parking import cuda_unavailable_reason

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_suspend_gpu import smi_gpu, smi_text

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "notebook-gpu.json"
IDLE_S = 3
TENSOR = """
import torch, time
g = torch.Generator(device="cuda").manual_seed(29)
x = torch.rand(1024 ** 3, device="cuda", generator=g)  # 4 GiB of float32
torch.cuda.synchronize()
print(repr(x.sum(dtype=torch.float64).item()))
torch.cuda.empty_cache()  # the sum's float64 copy: park the tensor, not the allocator's cache
"""
FILL = """
import torch
free, total = torch.cuda.mem_get_info()
hog = torch.empty(int(free * 0.95), dtype=torch.uint8, device="cuda")
hog.fill_(1)
torch.cuda.synchronize()
print(round(hog.numel() / total, 3))
"""
AGAIN = """
t0 = time.monotonic()
s = repr(x.sum(dtype=torch.float64).item())
torch.cuda.empty_cache()
print(s, round(time.monotonic() - t0, 3))
"""


def _skip_reason() -> str:
    for name in ("jupyter_client", "ipykernel", "zmq"):
        try:
            __import__(name)
        except ImportError:
            return f"needs {name} (pip install 'gpupool[notebook]')"
    try:
        import torch
    except ImportError:
        return "needs torch"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    return cuda_unavailable_reason() or ""


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or "ok")]


def declare_provisioner(site: Path) -> None:
    """Make the entry point findable where gpupool runs from its source tree."""
    from importlib.metadata import entry_points

    if entry_points(group="jupyter_client.kernel_provisioners", name="gpupool-provisioner"):
        return
    info = site / "gpupool_notebook_here-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpupool-notebook-here\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[jupyter_client.kernel_provisioners]\ngpupool-provisioner = gpupool.serving.notebook.provisioner:GpupoolProvisioner\n"
    )
    sys.path.insert(0, str(site))


def run_cell(kc: Any, code: str, timeout: float = 300.0) -> Tuple[str, str, float]:
    """(stdout, stderr, seconds from the request to its reply) of one cell."""
    out: List[str] = []
    err: List[str] = []

    def output(msg: Dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            (out if msg["content"]["name"] == "stdout" else err).append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            err.append("\n".join(msg["content"]["traceback"]))

    started = time.monotonic()
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=output)
    took = time.monotonic() - started
    assert reply["content"]["status"] == "ok", "".join(err)
    return "".join(out), "".join(err), took


def lease_state(kernel_id: str) -> Dict[str, Any]:
    from gpupool.workload.client.resolve import connect_all

    (client,) = connect_all(None)
    try:
        leases = [x for x in client.status().leases if kernel_id in x.holder.label]
        assert len(leases) == 1, leases
        return leases[0].to_dict()
    finally:
        client.close()


def test_an_idle_kernel_is_parked_gives_the_gpu_away_and_sums_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_client.manager import KernelManager

    for key in [k for k in os.environ if k.startswith(("GPUPOOL_", "JUPYTER_"))]:
        monkeypatch.delenv(key)
    src = str(REPO / "src")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("GPUPOOL_STATE", str(tmp_path / "state"))
    for name, sub in (("JUPYTER_DATA_DIR", "data"), ("JUPYTER_PATH", "data"), ("JUPYTER_RUNTIME_DIR", "runtime")):
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "config"))
    declare_provisioner(tmp_path / "site")
    from gpupool.cli.main import main

    assert main(["kernel", "install", "held", "--fraction", "0.25", "--idle-suspend", f"{IDLE_S}s"]) == 0
    assert main(["kernel", "install", "filler", "--fraction", "1", "--idle-suspend", "1h"]) == 0

    held = KernelManager(kernel_name="held")
    held.start_kernel()
    kc = held.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        first, _, first_s = run_cell(kc, TENSOR)
        used_running = smi_gpu("memory.used")
        idle_from = time.monotonic()
        deadline = idle_from + IDLE_S + 120
        while lease_state(held.kernel_id)["state"] != "suspended":
            assert time.monotonic() < deadline, lease_state(held.kernel_id)
            time.sleep(0.1)
        parked_after_s = time.monotonic() - idle_from
        parked = lease_state(held.kernel_id)
        used_parked = smi_gpu("memory.used")

        filler = KernelManager(kernel_name="filler")
        filler.start_kernel()
        fc = filler.client()
        fc.start_channels()
        fc.wait_for_ready(timeout=120)
        filled, _, fill_s = run_cell(fc, FILL)
        used_filled = smi_gpu("memory.used")
        fc.stop_channels()
        filler.shutdown_kernel()

        again, err, cell_s = run_cell(kc, AGAIN)
        total, sum_s = again.split()
        resumed = lease_state(held.kernel_id)
        result = {
            "gpu": smi_text("name"),
            "driver": smi_text("driver_version"),
            "tensor_gib": 4,
            "idle_suspend_s": IDLE_S,
            "first_sum": first.strip(),
            "sum_after_resume": total,
            "same_sum": total == first.strip(),
            "first_cell_s": round(first_s, 3),
            "suspended_after_idle_s": round(parked_after_s, 3),
            "parked_host_gib": round(parked["suspension"]["host_bytes"] / 2**30, 2),
            "used_mib_running": used_running,
            "used_mib_parked": used_parked,
            "filler_share_of_gpu": float(filled.strip()),
            "used_mib_filled": used_filled,
            "filler_cell_s": round(fill_s, 3),
            "cell_start_to_result_s": round(cell_s, 3),
            "sum_inside_cell_s": float(sum_s),
            "lease_state_after": resumed["state"],
            "same_lease": resumed["id"] == parked["id"],
            "stderr_of_cell": err,
        }
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        assert parked["state"] == "suspended" and parked["devices"] == []
        assert result["filler_share_of_gpu"] > 0.8, result
        assert result["same_sum"] and result["same_lease"] and resumed["state"] == "running", result
    finally:
        kc.stop_channels()
        if held.has_kernel:
            held.shutdown_kernel(now=True)
