"""A local job in `mps` isolation starts a replica only where the MPS control daemon answers: without
one, CUDA would run it with no memory or SM limit (runner/mps_check.py). The stand-in daemon of
the `fake_mps` fixture takes the driver's binary's place (real processes, a UNIX socket)."""

from __future__ import annotations

import os
import signal

import pytest
from waiting import wait_until

from gpupool.pooling.isolation.env import MPS_WAIT_ENV
from gpupool.pooling.isolation.mps import mps_dirs, stop_detached
from gpupool.pooling.isolation.proctree import alive


@pytest.fixture
def mps_shell(shell, fake_mps):
    """The shell's embedded pool in `mps` isolation, its stand-in daemon running; no daemon outlives the test."""
    shell.env.update(PATH=os.environ["PATH"], FAKE_MPS_RECORD=str(fake_mps))
    shell.run("run", "-q", "--isolation", "mps", "-p", "0.25", "--", "true")
    yield shell
    pids = [int(p.stem) for p in fake_mps.glob("*.json")]
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not any(alive(p) for p in pids), 30, "the stand-in daemons' end")


def spec(name: str, mark) -> dict:
    command = ["python", "-c", f"import os; open({str(mark)!r}, 'w').write(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"]
    return {
        "name": name,
        "framework": "pytorch",
        "roles": {"worker": {"replicas": 1, "command": command, "gpu": {"count": 1, "fraction": 0.25}}},
    }


def test_a_replica_starts_where_the_daemon_answers(mps_shell, tmp_path):
    mark = tmp_path / "ran"
    mps_shell.run("submit", mps_shell.write_spec(spec("capped", mark)))
    mps_shell.wait_for("capped", lambda s: s["status"] == "Succeeded", timeout=120)
    assert mark.read_text() == str(mps_dirs(mps_shell.state)[0])


def test_no_replica_starts_without_the_daemon_and_the_lease_is_released(mps_shell, tmp_path):
    assert stop_detached(mps_shell.state) is True
    mps_shell.env[MPS_WAIT_ENV] = "1"
    mark = tmp_path / "ran"
    mps_shell.run("submit", mps_shell.write_spec(spec("uncapped", mark)))
    state = mps_shell.wait_for("uncapped", lambda s: s["status"] == "Failed", timeout=120)
    assert "no MPS control daemon answered on" in state["message"] and "was not started" in state["message"]
    assert "\n" not in state["message"]
    assert not mark.exists() and not any(r.get("pid") for r in state["replicas"].values())
    assert wait_until(lambda: mps_shell.leases() == [], 60, "the job's lease released")
