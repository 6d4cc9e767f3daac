"""Issue 38 on CPU: starts of a job that tries to allocate past its share never run over their cap,
while the server is killed and restarted, while other uids hold the attestation socket busy, and
while the MPS control daemon does not answer.

`benchmarks/bench_fail_closed.py` runs 1,000 such starts and records the figures; this test runs
GPUPOOL_FAIL_CLOSED_STARTS of them (default 60: every disturbance, twice for most), with real
processes: a `gpupool server` in `mps` isolation, `gpupool run` per start, the stand-in MPS control
daemon (benchmarks/mps_stand_in.py; the driver's binary is not on a CPU machine) and the emulated
usage file for NVML.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_fail_closed.py"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))  # the script imports its neighbours
    spec = importlib.util.spec_from_file_location("bench_fail_closed", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_no_start_runs_over_its_cap_through_restarts_busy_attestation_and_a_silent_mps_daemon(bench):
    starts = int(os.environ.get("GPUPOOL_FAIL_CLOSED_STARTS", "60"))
    report = bench.run(starts=starts, block=10, parallel=4)
    assert report["starts"] == starts
    assert report["over_cap"] == 0, report["over_cap_starts"]
    assert report["ran_capped"] > 0, "no start ran at all: nothing was measured"
    assert report["refused_without_one_line_reason"] == 0, report["reasons_by_exit_code"]
    assert report["outlived_their_run"] == 0
    assert report["leases_left_after_ttl"] == 0
    kinds = report["per_kind"]
    assert all(kinds[kind]["starts"] > 0 for kind in bench.KINDS), kinds
    # Nothing answered on the pipe folder for the whole block: every start refused, each with exit 13.
    assert kinds["mps-down"]["ran"] == 0, kinds["mps-down"]
    assert report["reasons_by_exit_code"]["13"]["by_kind"] == {"mps-down": kinds["mps-down"]["starts"]}
    assert "no MPS control daemon answered on" in report["reasons_by_exit_code"]["13"]["example"]
    assert report["server_kills"] >= 1
    if os.geteuid() == 0:
        assert report["blocks_under_attestation_starvers"] >= 1
    for code, entry in report["reasons_by_exit_code"].items():
        assert entry["example"].startswith(bench.ERROR_PREFIX) or code not in ("5", "9", "13"), entry


def run_job(bench, tmp_path: Path, env: dict) -> dict:
    record = tmp_path / "job.json"
    done = subprocess.run(
        [sys.executable, "-c", bench.JOB, str(record), str(bench.WANT_MIB), "0"],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return bench.classify(0, "alone", done, record, bench.SHARE_MIB)


def test_the_count_sees_a_start_that_no_daemon_capped(bench, tmp_path):
    """The job alone, with an MPS contract but no daemon on its pipe folder (what a start without the
    runner's check would run): counted over its cap. With a daemon listening there: capped."""
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    contract = {
        "CUDA_VISIBLE_DEVICES": "GPU-emulated-0",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={bench.SHARE_MIB}M",
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "GPUPOOL_EMULATED_USAGE": str(tmp_path / "usage.json"),
    }
    uncapped = run_job(bench, tmp_path, contract)
    assert uncapped["started"] and uncapped["cap_by"] == "none"
    assert uncapped["over_cap"] is True and uncapped["used_mib"] == bench.WANT_MIB
    with socket.socket(socket.AF_UNIX) as daemon:
        daemon.bind(str(pipe / "control"))
        daemon.listen(8)
        capped = run_job(bench, tmp_path, contract)
    assert capped["cap_by"] == "mps" and capped["over_cap"] is False and capped["used_mib"] == bench.SHARE_MIB
    assert json.loads((tmp_path / "usage.json").read_text()) == {"GPU-emulated-0": {}}  # each left its row
