"""Issue 26's second done-when: a two-replica job with `checkpoints: s3://…`, preempted through the
queues, resumes from the bucket. Queues a and b of quota 1 on two emulated GPUs; the job (queue a)
borrows b's GPU, a `gpupool run --queue b` takes it back, both replicas get SIGTERM mid-epoch and
rank 0 puts its checkpoint in the bucket; when B ends the job reruns, resumes there and finishes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchvision")
pytestmark = [pytest.mark.slow, pytest.mark.torch]

from waiting import cpu_seconds, wait_until  # noqa: E402

from gpupool.train import storage  # noqa: E402
from gpupool.train.run_place import CHECKPOINTS, newest_first  # noqa: E402


def _checkpoints(url: str) -> list:
    return newest_first(storage.listdir(storage.join(url, CHECKPOINTS)))


# Enough epochs that the preemption lands mid-run however slowly the machine takes it.
EPOCHS = 5


def test_a_preempted_two_replica_job_resumes_from_the_bucket(shell, s3_server, s3_bucket: str, tmp_path: Path) -> None:
    from gpupool.train.digits import export_digits

    export_digits(tmp_path / "digits", limit_per_class=60)
    data, run = s3_bucket + "/digits", s3_bucket + "/jobs/team-a"
    storage.put_tree(tmp_path / "digits", data)
    shell.env.update(s3_server.env)
    shell.run("queue", "set", "a", "--quota", "1")
    shell.run("queue", "set", "b", "--quota", "1")
    train = ["gpupool", "train", "--data", data, "--model", "convnet", "--image-size", "32", "--epochs", str(EPOCHS)]
    train += ["--batch-size", "4", "--workers", "0", "--patience", "50", "--device", "cpu"]
    job = {
        "name": "team-a",
        "framework": "pytorch",
        "queue": "a",
        "checkpoints": run,  # no --out: the trainer takes GPUPOOL_CHECKPOINTS
        "env": {"OMP_NUM_THREADS": "1", "GPUPOOL_CACHE_DIR": str(tmp_path / "cache")},
        "roles": {"worker": {"replicas": 2, "command": train, "gpu": {"count": 1, "fraction": 1.0}}},
    }
    shell.run("submit", shell.write_spec(job))
    wait_until(lambda: _checkpoints(run), 180, "a checkpoint of team-a", detail=lambda: shell.state_of("team-a"))
    # That checkpoint is epoch 1's end, and the trainer's epoch-end stop check follows it: a preemption
    # sent at once stops the job after epoch 1, with no step inside an epoch to resume from. Into epoch
    # 2's steps first: 0.3 s of worker-0's own CPU time (an epoch is about 50 steps of it per rank).
    trainer = shell.state_of("team-a")["replicas"]["worker-0"]["pid"]
    since = cpu_seconds(trainer)
    wait_until(lambda: cpu_seconds(trainer) >= since + 0.3, 120, "worker-0 into epoch 2", interval=0.02)

    b_stop = tmp_path / "b.stop"
    b = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "run", "--queue", "b", "-p", "1", "--", "sh", "-c"]
        + [f"while [ ! -e {b_stop} ]; do sleep 0.05; done"],
        env=shell.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        shell.wait_for("team-a", lambda s: s["status"] == "Queued" and s["preemptions"] == 1, timeout=60)
        saved = _checkpoints(run)
        # SIGTERM came mid-epoch: the newest checkpoint is of a step inside an epoch, not an epoch's end
        assert not saved[0].endswith("-000000000.pt"), saved
        b_stop.touch()
        _, err = b.communicate(timeout=30)
        assert b.returncode == 0, err
    finally:
        b_stop.touch()
        if b.poll() is None:
            b.kill()

    done = shell.wait_for("team-a", lambda s: s["status"] in ("Succeeded", "Failed"), timeout=240)
    assert done["status"] == "Succeeded" and done["preemptions"] == 1 and done["restarts"] == 0, done
    _, epochs_done, step = saved[0].split(".")[0].split("-")
    log = shell.run("logs", "team-a", "--replica", "worker-0").stdout
    assert f"resuming {run} in epoch {int(epochs_done) + 1} after step {int(step)}" in log, log
    report = json.loads(storage.read_bytes(run + "/report.json"))
    assert report["epochs_run"] == EPOCHS and report["world_size"] == 2
    assert shell.leases() == []
