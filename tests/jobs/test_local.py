"""The local executor with real processes: DDP to completion, restarts, kill -9, cancel, gang queueing."""

from __future__ import annotations

import os
import signal

import pytest
from waiting import holds, tail, wait_until

from gpupool.jobs.executors.local import processes
from gpupool.pooling.isolation.proctree import alive

DDP = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
restart = os.environ["GPUPOOL_RESTART_COUNT"]
if os.environ.get("FAIL_ONCE") == os.environ["RANK"] and restart == "0":
    raise SystemExit(1)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "sum", int(t.item()),
      "gpus", os.environ["CUDA_VISIBLE_DEVICES"], "restart", restart)
dist.barrier()
dist.destroy_process_group()
"""


def ddp_spec(name="ddp", **extra):
    spec = {
        "name": name,
        "framework": "pytorch",
        "restartPolicy": "OnFailure",
        "backoffLimit": 2,
        "backoffSeconds": 0.1,
        "roles": {"worker": {"replicas": 2, "command": ["python", "-c", DDP], "gpu": {"count": 1, "fraction": 0.5}}},
    }
    spec.update(extra)
    return spec


SLEEPER = ["python", "-c", "import time; print('up', flush=True); time.sleep(600)"]


def test_ddp_job_runs_to_completion(shell):
    path = shell.write_spec(ddp_spec())
    out = shell.run("submit", path, "--follow", timeout=120)
    assert "rank 0 of 2 sum 3" in out.stdout and "rank 1 of 2 sum 3" in out.stdout
    assert "[worker-1]" in out.stdout  # followed logs are prefixed per replica
    st = shell.state_of("ddp")
    assert st["status"] == "Succeeded" and st["restarts"] == 0
    gpus = {r["devices"] for r in st["replicas"].values()}
    assert len(gpus) == 2 and all(g.startswith("GPU-") for g in gpus)  # each replica its own share
    assert shell.leases() == []  # released at the end
    listing = shell.run("jobs").stdout
    assert "ddp" in listing and "Succeeded" in listing
    one = shell.run("logs", "ddp", "--replica", "worker-1").stdout
    assert "rank 1 of 2" in one and "[worker-1]" not in one


def test_replica_exit_1_restarts_the_group(shell):
    path = shell.write_spec(ddp_spec("flaky", env={"FAIL_ONCE": "1"}))
    shell.run("submit", path, "--follow", timeout=120)
    st = shell.state_of("flaky")
    assert st["status"] == "Succeeded" and st["restarts"] == 1
    assert [r["restarts"] for r in st["replicas"].values()] == [1, 1]  # the whole group, as torchrun does
    log = shell.run("logs", "flaky", "--replica", "worker-0").stdout
    assert "attempt 2" in log and "restart 1" in log


def test_never_policy_fails_with_the_reason(shell):
    path = shell.write_spec(ddp_spec("brittle", restartPolicy="Never", env={"FAIL_ONCE": "1"}))
    proc = shell.run("submit", path, "--follow", check=False, timeout=120)
    assert proc.returncode == 1
    st = shell.state_of("brittle")
    assert st["status"] == "Failed" and "worker-1 exited with 1" in st["message"]
    assert shell.leases() == []


def test_cancel_from_another_shell_leaves_nothing(shell):
    spec = {
        "name": "sleepy",
        "framework": "pytorch",
        "roles": {"worker": {"replicas": 2, "command": SLEEPER, "gpu": {"fraction": 0.5}}},
    }
    shell.run("submit", shell.write_spec(spec))
    st = shell.wait_for("sleepy", lambda s: s["status"] == "Running")
    assert len(shell.leases()) == 1  # one gang lease for both replicas
    pids = [r["pid"] for r in st["replicas"].values()]
    assert all(alive(p) for p in pids)
    shell.run("cancel", "sleepy")
    st = shell.state_of("sleepy")
    assert st["status"] == "Cancelled"
    assert processes.marked_processes(shell.state / "jobs" / "sleepy") == []
    assert not any(alive(p) for p in pids + [st["supervisor_pid"]])
    assert shell.leases() == []
    assert "already cancelled" in shell.run("cancel", "sleepy").stderr


def test_cancel_after_supervisor_kill_9(shell):
    spec = {"name": "orphan", "roles": {"worker": {"replicas": 2, "command": SLEEPER, "gpu": {"fraction": 0.5}}}}
    shell.run("submit", shell.write_spec(spec))
    st = shell.wait_for("orphan", lambda s: s["status"] == "Running")
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    wait_until(lambda: not alive(st["supervisor_pid"]), 10, "the supervisor's end")
    assert "supervisor" in shell.run("jobs").stdout  # says the supervisor is gone
    shell.run("cancel", "orphan")
    assert processes.marked_processes(shell.state / "jobs" / "orphan") == []
    assert shell.leases() == []
    assert shell.state_of("orphan")["status"] == "Cancelled"


def test_gang_that_does_not_fit_is_queued_whole(shell):
    big = {"name": "big", "roles": {"worker": {"replicas": 2, "command": SLEEPER, "gpu": {"fraction": 0.75}}}}
    shell.run("submit", shell.write_spec(big))
    shell.wait_for("big", lambda s: s["status"] == "Running")
    # Each GPU has a quarter left: the gang of two halves must wait, holding nothing.
    small = ddp_spec("small")
    shell.run("submit", shell.write_spec(small))
    st = shell.wait_for("small", lambda s: s["status"] == "Queued")
    assert "needs" in st["message"]
    logs = shell.run("logs", "small")  # issue 25: a queued job's logs say it is queued, and why
    assert logs.stdout == "" and "job small is queued: " in logs.stderr and "needs" in logs.stderr
    # time for a wrong grant: the queued job holds nothing, look after look
    holds(
        lambda: (
            len(shell.leases()) == 1
            and shell.queued() == 1
            and shell.state_of("small")["replicas"]["worker-0"]["pid"] == 0
        ),
        1.0,
        "the queued job holds nothing (one lease, one queued claim, no worker started)",
        checks=3,
    )
    shell.run("cancel", "big")
    st = shell.wait_for("small", lambda s: s["status"] == "Succeeded", timeout=90)
    assert st["lease_id"] and shell.leases() == []


def test_gang_that_can_never_fit_is_refused(shell):
    spec = ddp_spec("huge")
    spec["roles"]["worker"]["replicas"] = 3
    spec["roles"]["worker"]["gpu"] = {"fraction": 0.75}
    proc = shell.run("submit", shell.write_spec(spec), check=False)
    assert proc.returncode == 2 and "can never run" in proc.stderr and "Traceback" not in proc.stderr


def test_two_jobs_get_distinct_ports(shell):
    for name in ("one", "two"):
        spec = {"name": name, "framework": "tensorflow", "roles": {"worker": {"replicas": 2, "command": SLEEPER}}}
        shell.run("submit", shell.write_spec(spec))
    a = shell.wait_for("one", lambda s: s["status"] == "Running")["ports"]
    b = shell.wait_for("two", lambda s: s["status"] == "Running")["ports"]
    assert len(set(a) | set(b)) == 4
    for name in ("one", "two"):
        shell.run("cancel", name)


@pytest.mark.slow
def test_kill_9_of_a_replica_mid_epoch_still_ends_with_a_report(shell):
    pytest.importorskip("torchvision")
    spec = {
        "name": "digits",
        "framework": "pytorch",
        "restartPolicy": "ExitCode",
        "backoffLimit": 2,
        "backoffSeconds": 0.5,
        "setup": ["gpupool", "data", "digits", "--to", "$(GPUPOOL_JOB_DIR)/data"],
        "roles": {
            "worker": {
                "replicas": 2,
                "gpu": {"fraction": 0.5},
                "env": {"OMP_NUM_THREADS": "1"},
                "command": [
                    "gpupool",
                    "train",
                    "--data",
                    "$(GPUPOOL_JOB_DIR)/data",
                    "--model",
                    "convnet",
                    "--image-size",
                    "16",
                    "--epochs",
                    "3",
                    "--batch-size",
                    "64",
                    "--workers",
                    "0",
                    "--out",
                    "$(GPUPOOL_JOB_DIR)/run",
                ],
            }
        },
    }
    shell.run("submit", shell.write_spec(spec))
    log = shell.state / "jobs" / "digits" / "logs" / "worker-0.log"
    wait_until(
        lambda: "epoch 1/3" in tail(log, 10**6),
        120,
        "epoch 1/3 in the worker's log",
        detail=lambda: shell.state_of("digits"),
    )
    victim = shell.state_of("digits")["replicas"]["worker-1"]["pid"]
    os.kill(victim, signal.SIGKILL)
    st = shell.wait_for("digits", lambda s: s["status"] in ("Succeeded", "Failed", "Cancelled"), timeout=180)
    assert st["status"] == "Succeeded", st
    assert st["restarts"] == 1 and st["replicas"]["worker-1"]["restarts"] == 1
    assert (shell.state / "jobs" / "digits" / "run" / "report.json").exists()
    assert "test_accuracy" in shell.run("logs", "digits", "--replica", "worker-0").stdout
    assert shell.leases() == []


def test_horovod_env_and_rendezvous_store(shell):
    script = (
        "import os, urllib.request as u; e = os.environ; "
        "base = f\"http://{e['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{e['HOROVOD_GLOO_RENDEZVOUS_PORT']}/global/\"; "
        "u.urlopen(u.Request(base + e['HOROVOD_RANK'], data=b'x', method='PUT')); "
        "print('hvd', e['HOROVOD_RANK'], e['HOROVOD_SIZE'], e['HOROVOD_CONTROLLER'])"
    )
    spec = {
        "name": "hvd",
        "framework": "horovod",
        "roles": {"worker": {"replicas": 2, "command": ["python", "-c", script]}},
    }
    out = shell.run("submit", shell.write_spec(spec), "--follow").stdout
    assert "hvd 0 2 gloo" in out and "hvd 1 2 gloo" in out
