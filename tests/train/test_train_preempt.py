"""A preempted training: SIGTERM to the trainer's process group in the middle of an epoch (what
`gpupool run` sends on a preemption), then the rerun `gpupool run --requeue` starts."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytestmark = pytest.mark.torch

from gpupool_cli import gpupool_cmd  # noqa: E402
from waiting import cpu_seconds, wait_until  # noqa: E402

from gpupool.pooling.isolation import env as contract  # noqa: E402
from gpupool.pooling.isolation.env import ATTEMPT_ENV, PREEMPTED_ENV  # noqa: E402
from gpupool.train import preempt  # noqa: E402
from gpupool.train.checkpoint import CHECKPOINT_FILE  # noqa: E402
from gpupool.train.preempt import STOPPED_EXIT_CODE  # noqa: E402

from .conftest import run_env, run_gpupool  # noqa: E402

# One loader worker: it shares the trainer's process group, so it gets the SIGTERM too.
# Touches argv[2] once it runs, then waits for argv[1].
WAIT_FOR_FILE = (
    "import os, sys, time\nopen(sys.argv[2], 'w').close()\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"
)
ARGS = ["--model", "convnet", "--image-size", "32", "--workers", "1", "--epochs", "3", "--batch-size", "4"]


def _rows(run: Path) -> List[Dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _report(run: Path) -> Dict[str, Any]:
    return json.loads((run / "report.json").read_text())


def test_the_trainer_reads_the_env_names_the_runner_sets() -> None:
    assert (preempt.PREEMPTED_ENV, preempt.ATTEMPT_ENV) == (contract.PREEMPTED_ENV, contract.ATTEMPT_ENV)


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_and_the_rerun_ends_like_an_unbroken_run(digits_dir: Path, tmp_path: Path) -> None:
    args = ["--data", str(digits_dir), *ARGS, "--patience", "50"]
    unbroken = run_gpupool("train", *args, "--out", str(tmp_path / "unbroken"))
    assert unbroken.returncode == 0, unbroken.stderr

    out = tmp_path / "preempted"
    proc = subprocess.Popen(
        gpupool_cmd("train", *args, "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=run_env(),
        start_new_session=True,  # its own process group, as `gpupool run` starts a command
    )
    wait_until(lambda: _rows(out) or proc.poll() is not None, 180, "the first epoch to finish", interval=0.02)
    assert _rows(out), "the first epoch never finished"
    # Its end-of-epoch checkpoint follows the row, and the epoch-end stop check follows that: a
    # SIGTERM sent before both would stop it after epoch 1, not in epoch 2.
    wait_until(lambda: (out / CHECKPOINT_FILE).exists() or proc.poll() is not None, 120, "epoch 1's checkpoint")
    # into epoch 2's steps (an epoch is several hundred of them): 0.3 s of the trainer's own CPU time on
    since = cpu_seconds(proc.pid)
    wait_until(lambda: cpu_seconds(proc.pid) >= since + 0.3, 120, "the trainer into epoch 2", interval=0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == STOPPED_EXIT_CODE, stderr
    assert "stopped by SIGTERM after step" in stderr and "of epoch 2" in stderr, stderr
    assert not (out / "report.json").exists()
    saved = torch.load(out / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
    assert saved["epoch"] == 1 and saved["partial"]["steps"] > 0
    steps_done = saved["partial"]["steps"]

    # --no-resume would start over; the rerun of a preempted command resumes all the same.
    rerun = run_gpupool("train", *args, "--out", str(out), "--no-resume", env={PREEMPTED_ENV: "1", ATTEMPT_ENV: "2"})
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming {out} in epoch 2 after step {steps_done}" in rerun.stderr
    report, reference = _report(out), _report(tmp_path / "unbroken")
    assert report["epochs_run"] == reference["epochs_run"] == 3
    assert [r["epoch"] for r in _rows(out)] == [1, 2, 3]
    # Same samples in the same order, same RNG and optimizer state: CPU training lands on the same model.
    assert report["test_accuracy"] == reference["test_accuracy"]
    assert abs(_rows(out)[1]["train_loss"] - _rows(tmp_path / "unbroken")[1]["train_loss"]) < 1e-4


@pytest.mark.slow
def test_a_training_preempted_under_gpupool_run_requeue_resumes_and_finishes(digits_dir: Path, tmp_path: Path) -> None:
    """The whole path: team B preempts the trainer's borrowed GPU; the runner SIGTERMs it, the
    trainer saves, the runner claims again after B and the rerun resumes to the last epoch."""
    env = run_env(
        {"GPUPOOL_STATE": str(tmp_path / "state"), "GPUPOOL_DEVICES": "emulated:2x16GiB", "HOME": str(tmp_path)}
    )
    for name in ("GPUPOOL_SERVER", "GPUPOOL_TOKEN", "GPUPOOL_CONFIG"):
        env.pop(name, None)

    start = functools.partial(subprocess.Popen, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    for name in ("a", "b"):
        done = subprocess.run(
            # requeue: the test follows the SIGTERM, the checkpoint and the rerun (the default suspends)
            gpupool_cmd("queue", "set", name, "--quota", "1", "--preempt", "requeue"),
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
    stop = tmp_path / "stop-a1"
    running = tmp_path / "a1-runs"
    within_quota = start(
        gpupool_cmd("run", "--queue", "a", "--", sys.executable, "-c", WAIT_FOR_FILE, str(stop), str(running))
    )
    wait_until(running.exists, 60, "A's job within quota to start")
    out = tmp_path / "run"
    train_args = ["--data", str(digits_dir), "--out", str(out), "--device", "cpu", "--patience", "50"]
    train_args += ["--model", "convnet", "--image-size", "32", "--workers", "0", "--epochs", "3", "--batch-size", "4"]
    borrowed = start(
        gpupool_cmd(
            "run", "--queue", "a", "--requeue", "--preempt-grace", "60", "--", *gpupool_cmd("train", *train_args)
        )
    )
    wait_until(lambda: _rows(out) or borrowed.poll() is not None, 180, "the borrowed run's first epoch")
    assert _rows(out), "the first epoch never finished"
    team_b = start(gpupool_cmd("run", "--queue", "b", "--", sys.executable, "-c", "import time; time.sleep(1)"))
    _, b_err = team_b.communicate(timeout=120)
    assert team_b.returncode == 0, b_err
    _, err = borrowed.communicate(timeout=300)
    stop.touch()
    within_quota.communicate(timeout=60)
    assert borrowed.returncode == 0, err
    assert "was preempted" in err and "stopped by SIGTERM after" in err and "attempt 2" in err, err
    assert "resuming" in err, err
    assert _report(out)["epochs_run"] == 3
    assert [r["epoch"] for r in _rows(out)] == [1, 2, 3]
    assert within_quota.returncode == 0
