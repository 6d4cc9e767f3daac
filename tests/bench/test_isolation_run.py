"""`gpupool bench isolation` end to end on this CPU: real `gpupool run` leases on an emulated GPU,
the probes on the CPU, the report files, hostile flags, and nothing left after a kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest
from gpupool_cli import gpupool, gpupool_cmd
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
# The smallest probes that still do real work on a CPU.
TINY = ["--device", "cpu", "--matmul-size", "128", "--model", "resnet18", "--image-size", "32", "--train-batch", "2"]


@pytest.fixture
def env(tmp_path) -> Dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_SERVER", "GPUPOOL_STATE")}
    out.update(GPUPOOL_DEVICES="emulated:1x16GiB", OMP_NUM_THREADS="1")
    out["PYTHONPATH"] = str(REPO / "src") + os.pathsep + out.get("PYTHONPATH", "")
    return out


def _leases(state: Path) -> list:
    from gpupool.workload.client.embedded import EmbeddedPoolClient

    with EmbeddedPoolClient(state) as client:
        return list(client.status().leases)


def _probe_pids(out: Path) -> List[int]:
    return [int(p.read_text()) for p in (out / "rounds").glob("*/*.ready")]


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--pairs", "0.5/0.7"], "'0.5/0.7'"),
        (["--pairs", "0.5"], "'0.5'"),
        (["--parts", "splits,speed"], "'splits,speed'"),
        (["--modes", "vgpu"], "'vgpu'"),
        (["--starts", "0"], "--starts 0"),
        (["--split-seconds", "-1"], "--split-seconds -1"),
        (["--device", "tpu"], "'tpu'"),
    ],
)
def test_hostile_flags_get_one_line_and_exit_2(tmp_path, env, flags, named):
    done = gpupool("bench", "isolation", "--out", str(tmp_path / "out"), *flags, env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.torch
def test_splits_and_neighbour_run_as_leases_and_leave_nothing(tmp_path, env):
    pytest.importorskip("torchvision")
    out = tmp_path / "out"
    done = subprocess.run(
        gpupool_cmd("bench", "isolation", "--out", str(out), "--parts", "splits,neighbour", "--modes", "hooks",
                    "--pairs", "0.25/0.75", "--split-seconds", "3", "--alone-seconds", "2", "--neighbour-seconds", "3",
                    "--interval", "0.05", *TINY),
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    splits = json.loads((out / "splits.json").read_text())
    assert splits["device"] == "cpu" and splits["part"] == "splits"
    [row] = splits["splits"]
    assert row["mode"] == "hooks" and row["asked"] == [0.25, 0.75] and row["window_s"] >= 2
    assert all(r > 0 for r in row["rates"])
    assert splits["alone"][0]["of_whole_gpu"] > 0
    neighbour = json.loads((out / "neighbour.json").read_text())
    [setup] = neighbour["setups"]
    assert setup["setup"] == "time-sliced (hooks)"
    assert setup["inference_beside"]["requests"] > 0 and setup["trainer_beside_rate"] > 0
    # Each probe really ran under its lease's contract: the hooks' share, on the emulated GPU.
    sample = json.loads((out / "rounds" / "split-hooks-0.25-0.75" / "first.json").read_text())
    assert sample["cuda_env"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-emu")
    report = (out / "report.md").read_text()
    assert "| hooks | 0.25/0.75 | 1:3 |" in report and "time-sliced (hooks)" in report
    state = out / "state" / "hooks"
    assert _leases(state) == []
    from gpupool.pooling.isolation.proctree import alive

    pids = _probe_pids(out)
    assert len(pids) == 9  # splits: 2 alone + 2 together; neighbour: 3 alone + 2 together
    assert not [p for p in pids if alive(p)]


@pytest.mark.torch
def test_a_killed_harness_leaves_no_probe_and_no_lease(tmp_path, env):
    out = tmp_path / "out"
    harness = subprocess.Popen(
        gpupool_cmd("bench", "isolation", "--out", str(out), "--parts", "splits", "--modes", "hooks",
                    "--pairs", "0.5/0.5", "--split-seconds", "600", "--alone-seconds", "1", *TINY),
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    second = out / "rounds" / "split-hooks-0.5-0.5" / "second.json.ready"
    wait_until(
        lambda: second.exists() or harness.poll() is not None, timeout=600, what="the split's second probe ready"
    )
    assert harness.poll() is None
    pids = [int((second.parent / name).read_text()) for name in ("first.json.ready", "second.json.ready")]
    assert _leases(out / "state" / "hooks") != []
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    from gpupool.pooling.isolation.proctree import alive

    wait_until(lambda: not any(alive(p) for p in pids), timeout=60, what="both probes gone after the kill")
    wait_until(lambda: _leases(out / "state" / "hooks") == [], timeout=60, what="both leases released")
