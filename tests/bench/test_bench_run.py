"""`gpupool bench scaling|share` end to end on this CPU: emulated GPUs, real jobs (gang claim,
local executor, supervisor, workers), the three report files, and interruption by a real signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Dict

import pytest
from gpupool_cli import gpupool_cmd
from waiting import wait_until

pytest.importorskip("torchvision")
pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path) -> Dict[str, str]:
    state = tmp_path / "state"
    state.mkdir()
    out = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_SERVER", "OMP_NUM_THREADS", "RANK", "WORLD_SIZE")}
    out.update(GPUPOOL_STATE=str(state), GPUPOOL_DEVICES="emulated:2x16GiB")
    out["PYTHONPATH"] = str(REPO / "src") + os.pathsep + out.get("PYTHONPATH", "")
    yield out
    # Never leave a job behind, whatever the test did.
    from gpupool.jobs.executors.local import processes

    for job_dir in (state / "jobs").glob("*"):
        if job_dir.is_dir():
            processes.sweep(job_dir)


def _leases(state: str) -> list:
    from gpupool.workload.client.embedded import EmbeddedPoolClient

    with EmbeddedPoolClient(Path(state)) as client:
        return list(client.status().leases)


def _nothing_left(state: str) -> None:
    """No lease in the pool, no live process of any job, every supervisor gone."""
    from gpupool.jobs.executors.local import processes
    from gpupool.pooling.isolation.proctree import alive

    assert _leases(state) == []
    jobs = sorted(p for p in (Path(state) / "jobs").glob("*") if p.is_dir())
    assert jobs, "no job ever started"
    for job_dir in jobs:
        assert processes.marked_processes(job_dir) == [], job_dir.name
        st = json.loads((job_dir / "state.json").read_text())
        assert not alive(st["supervisor_pid"]), job_dir.name
        assert st["status"] in ("Succeeded", "Failed", "Cancelled"), st


def _report(out: Path) -> dict:
    assert (out / "report.md").read_text().startswith("# gpupool bench")
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"
    return json.loads((out / "report.json").read_text())


def test_scaling_on_emulated_gpus(tmp_path, env):
    out = tmp_path / "scaling"
    proc = subprocess.run(
        gpupool_cmd("bench", "scaling", "--model", "convnet", "--image-size", "32", "--gpus", "1,2", "--steps", "30", "--out", str(out), "--progress"),
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = _report(out)
    assert report["kind"] == "scaling" and report["settings"]["model"] == "convnet"
    assert [r["gpus"] for r in report["runs"]] == [1, 2]
    for run in report["runs"]:
        assert run["images_per_second"] > 0
        assert run["images_per_second_per_worker"] == pytest.approx(run["images_per_second"] / run["gpus"], rel=1e-3)
        assert 0 < run["step_p50_ms"] <= run["step_p95_ms"]
    one, two = report["runs"]
    assert one["efficiency"] == 1.0 and two["efficiency"] > 0
    # The two workers of the 2-GPU job held the pool's two (emulated) GPUs, one each.
    assert len(two["devices"]) == 2
    assert "[2/2] gpus=2" in proc.stderr and "step" in proc.stderr  # the progress bar
    _nothing_left(env["GPUPOOL_STATE"])


@pytest.mark.slow  # about 25 s: the Done-when command of `bench share`; the scaling one stays fast
def test_share_on_one_emulated_gpu(tmp_path, env):
    out = tmp_path / "share"
    proc = subprocess.run(
        gpupool_cmd("bench", "share", "--model", "convnet", "--image-size", "32", "--fractions", "1,0.5", "--steps", "30", "--out", str(out), "--json"),
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = _report(out)
    assert json.loads(proc.stdout)["runs"] == report["runs"]
    whole, half = report["runs"]
    assert (whole["fraction"], whole["jobs"], whole["aggregate_vs_whole"]) == (1.0, 1, 1.0)
    assert (half["fraction"], half["jobs"]) == (0.5, 2)
    assert all(x > 0 for x in half["per_job_images_per_second"])
    assert half["images_per_second"] == pytest.approx(sum(half["per_job_images_per_second"]), abs=0.1)
    assert 0 < half["fairness"] <= 1 and len(half["slowdown"]) == 2
    assert len(half["devices"]) == 1 and half["devices"][0].endswith("-0")  # both halves on GPU 0, as asked
    _nothing_left(env["GPUPOOL_STATE"])


def _wait_for_measuring(out: Path, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    def measuring() -> bool:
        assert proc.poll() is None, proc.communicate()
        for path in out.glob("runs/*/progress-*.json"):
            try:
                if json.loads(path.read_text())["phase"] in ("measure", "waiting", "holding"):
                    return True
            except ValueError:
                pass  # half-written
        return False

    wait_until(measuring, timeout, "the workers to start measuring", interval=0.1)


@pytest.mark.parametrize(
    "sig, args",
    [
        (signal.SIGINT, ["scaling", "--gpus", "2"]),
        pytest.param(signal.SIGTERM, ["share", "--fractions", "0.5"], marks=pytest.mark.slow),
    ],
)
def test_a_signal_leaves_no_process_and_no_lease(tmp_path, env, sig, args):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        gpupool_cmd("bench", *args, "--model", "convnet", "--image-size", "32", "--steps", "100000", "--out", str(out)),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        _wait_for_measuring(out, proc)
        assert _leases(env["GPUPOOL_STATE"]), "the job holds no lease while it runs"
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, stderr
    assert "every benchmark job was cancelled" in stderr
    _nothing_left(env["GPUPOOL_STATE"])


def test_a_run_the_pool_can_never_hold_is_refused_before_anything_starts(tmp_path, env):
    proc = subprocess.run(
        gpupool_cmd("bench", "scaling", "--model", "convnet", "--image-size", "32", "--gpus", "1,4", "--out", str(tmp_path / "o")),
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "gpus=4: 4 worker(s)" in proc.stderr and "this pool of 2 GPU(s)" in proc.stderr
    assert "lower --gpus" in proc.stderr
    assert not (Path(env["GPUPOOL_STATE"]) / "jobs").exists() and not (tmp_path / "o" / "report.json").exists()


@pytest.mark.slow  # about 10 s; the fast set keeps the signal during a running gang
def test_a_signal_while_queued_for_gpus_leaves_no_process_and_no_lease(tmp_path, env, monkeypatch):
    from gpupool.core.model import Claim, GpuRequest, Holder
    from gpupool.workload.client.embedded import EmbeddedPoolClient

    monkeypatch.setenv("GPUPOOL_DEVICES", env["GPUPOOL_DEVICES"])
    state = Path(env["GPUPOOL_STATE"])
    with EmbeddedPoolClient(state) as client:  # someone else holds both GPUs for a while
        held = client.claim(Claim((GpuRequest(2, fraction=1.0),)), Holder("other", os.getpid()), ttl_s=300)
    proc = subprocess.Popen(
        gpupool_cmd("bench", "scaling", "--model", "convnet", "--image-size", "32", "--gpus", "1", "--out", str(tmp_path / "o")),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:

        def queued() -> bool:
            assert proc.poll() is None, proc.communicate()
            return any(p.read_text().count('"Queued"') for p in state.glob("jobs/*/state.json"))

        wait_until(queued, 60, "a queued job", interval=0.1)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert [lease.id for lease in _leases(env["GPUPOOL_STATE"])] == [held.id]  # only the other holder's
    with EmbeddedPoolClient(state) as client:
        client.release(held.id)
    _nothing_left(env["GPUPOOL_STATE"])


@pytest.mark.slow  # two short runs that fail in their workers
def test_a_failing_run_is_reported_and_the_others_still_run(tmp_path, env):
    data = tmp_path / "tiny"
    for c in ("a", "b"):
        (data / c).mkdir(parents=True)
        (data / c / "x.png").write_bytes(b"not an image")
    out = tmp_path / "o"
    proc = subprocess.run(
        gpupool_cmd("bench", "share", "--model", "convnet", "--image-size", "32", "--fractions", "0.5", "--data", str(data), "--batch-size", "8", "--out", str(out)),
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    report = _report(out)
    assert [r["fraction"] for r in report["runs"]] == [1.0, 0.5]
    for run in report["runs"]:
        assert "failed" in run["error"] and "lower --batch-size" in run["error"], run["error"]
    _nothing_left(env["GPUPOOL_STATE"])
