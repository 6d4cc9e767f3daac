"""`gpupool run` in `mps` isolation starts its command only where an MPS control daemon answers.

A CUDA program that finds no control daemon on its CUDA_MPS_PIPE_DIRECTORY runs without MPS: no
memory limit, no SM limit. The runner therefore asks the daemon right before the start, waits
for it up to GPUPOOL_MPS_WAIT seconds, and else fails closed (NotCapped, exit 13, the lease
released, the command never started).

The driver's `nvidia-cuda-mps-control` is not on this machine: the `fake_mps` fixture's stand-in
(tests/conftest.py) takes its place. It is a real daemon process (`-d` detaches one that serves
control commands on PIPE/control, a UNIX socket) and a real client (no flag: it connects there and
fails without a daemon, as the driver's binary does); what it cannot do is start an MPS server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from waiting import wait_until

from gpupool.core.errors import NotCapped
from gpupool.pooling.isolation.env import MPS_PIPE_ENV, MPS_WAIT_ENV
from gpupool.pooling.isolation.mps import ensure_detached, mps_dirs, stop_detached
from gpupool.pooling.isolation.proctree import alive

MARKER = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


def daemon_pids(record: Path) -> List[int]:
    return [int(p.stem) for p in record.glob("*.json")]


@pytest.fixture
def mps_pool(pool, fake_mps):
    """The embedded pool in `mps` isolation, its stand-in daemon running; every daemon ends after the test."""
    pool.env.update(PATH=os.environ["PATH"], FAKE_MPS_RECORD=str(fake_mps))
    done = pool.run("run", "-q", "--isolation", "mps", "-p", "0.5", "--", "true")
    assert done.returncode == 0, done.stderr
    assert pool.status()["isolation"]["mode"] == "mps"
    yield pool
    for pid in daemon_pids(fake_mps):
        if alive(pid):
            os.kill(pid, 9)
    assert wait_until(lambda: not any(alive(p) for p in daemon_pids(fake_mps)), 30, "the stand-in daemons' end")


def run_marking(pool, tmp_path: Path, env: Dict[str, str], *flags: str, timeout: float = 60):
    mark = tmp_path / f"mark-{len(list(tmp_path.glob('mark-*')))}.json"
    done = pool.run("run", *flags, "-p", "0.5", "--", sys.executable, "-c", MARKER, str(mark), env=env, timeout=timeout)
    return done, mark


def history(pool) -> list:
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "usage", "--by", "lease", "--json"],
        env=pool.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["leases"]


def test_with_the_daemon_answering_the_command_starts_with_its_pipe_folder(mps_pool, tmp_path):
    done, mark = run_marking(mps_pool, tmp_path, mps_pool.env, "-q")
    assert done.returncode == 0, done.stderr
    pipe, _ = mps_dirs(mps_pool.state)
    assert json.loads(mark.read_text())[MPS_PIPE_ENV] == str(pipe)
    assert done.stderr == ""  # no wait was said: the daemon answered at once


def test_with_no_daemon_the_command_never_starts_and_the_lease_is_released(mps_pool, tmp_path, fake_mps):
    assert stop_detached(mps_pool.state) is True  # the pool's mode stays mps; its daemon is gone
    assert wait_until(lambda: not any(alive(p) for p in daemon_pids(fake_mps)), 30, "the daemon's end")
    before = len(history(mps_pool))
    done, mark = run_marking(mps_pool, tmp_path, dict(mps_pool.env, **{MPS_WAIT_ENV: "1"}))
    assert done.returncode == NotCapped.exit_code == 13, done.stderr
    assert not mark.exists(), "the command ran without a daemon to cap it"
    pipe, log_dir = mps_dirs(mps_pool.state)
    errors = [line for line in done.stderr.splitlines() if line.startswith("gpupool: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"no MPS control daemon answered on {pipe} within 1s" in errors[0]
    assert "was not started" in errors[0] and "--isolation mps" in errors[0] and MPS_WAIT_ENV in errors[0]
    waits = [line for line in done.stderr.splitlines() if "waiting up to 1s for the MPS control daemon" in line]
    assert len(waits) == 1, done.stderr
    assert "Running client command" not in done.stderr
    assert mps_pool.status()["leases"] == []
    ended = history(mps_pool)
    assert len(ended) == before + 1 and ended[-1]["ended"] == "released", ended[-1]


def test_a_daemon_that_comes_back_within_the_wait_lets_the_command_start(mps_pool, tmp_path, fake_mps):
    assert stop_detached(mps_pool.state) is True
    mark = tmp_path / "mark-late.json"
    proc = mps_pool.start(
        "run",
        "-p",
        "0.5",
        "--",
        sys.executable,
        "-c",
        MARKER,
        str(mark),
        env=dict(mps_pool.env, **{MPS_WAIT_ENV: "120"}),
    )
    try:
        assert wait_until(lambda: mps_pool.status()["leases"] != [], 60, "the run's lease")
        assert not mark.exists()  # leased, but waiting for the daemon
        ensure_detached(mps_pool.state)  # the pool's daemon back (a restart)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert mark.exists() and "waiting up to 120s for the MPS control daemon" in err


def test_without_the_binary_the_control_socket_is_asked(mps_pool, tmp_path):
    """A container image without the driver's utilities: the daemon's socket in the pipe folder answers."""
    bare = dict(mps_pool.env, PATH=os.path.dirname(sys.executable))
    done, mark = run_marking(mps_pool, tmp_path, bare, "-q")
    assert done.returncode == 0 and mark.exists(), done.stderr
    assert stop_detached(mps_pool.state) is True
    done, mark = run_marking(mps_pool, tmp_path, dict(bare, **{MPS_WAIT_ENV: "0"}))
    assert done.returncode == 13 and not mark.exists(), done.stderr
    assert mps_pool.status()["leases"] == []


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_mps_wait_is_named_and_nothing_runs(mps_pool, tmp_path, value):
    done, mark = run_marking(mps_pool, tmp_path, dict(mps_pool.env, **{MPS_WAIT_ENV: value}))
    assert done.returncode == 2 and not mark.exists(), done.stderr
    assert f"{MPS_WAIT_ENV}={value!r} is not a number of seconds" in done.stderr and "Traceback" not in done.stderr
    assert mps_pool.status()["leases"] == []


def test_other_modes_never_load_the_check(pool, tmp_path):
    """The check costs `hooks` and `none` runs nothing: its module is not even imported."""
    probe = (
        "import sys, runpy; sys.argv = ['gpupool', 'run', '-q', '-p', '0.5', '--', 'true'];"
        "import atexit; atexit.register(lambda: print('LOADED' if 'gpupool.workload.runner.mps_check' in sys.modules"
        " or 'gpupool.pooling.isolation.mps' in sys.modules else 'NOT LOADED'));"
        "runpy.run_module('gpupool.cli.workload', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=pool.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "NOT LOADED", done.stdout


def test_a_latency_sensitive_run_goes_first_and_others_below_normal(mps_pool, tmp_path):
    from gpupool.pooling.isolation.env import MPS_PRIORITY_BELOW_NORMAL, MPS_PRIORITY_ENV, MPS_PRIORITY_NORMAL

    done, mark = run_marking(mps_pool, tmp_path, mps_pool.env, "-q", "--latency-sensitive")
    assert done.returncode == 0, done.stderr
    assert json.loads(mark.read_text())[MPS_PRIORITY_ENV] == MPS_PRIORITY_NORMAL
    # Asking through its own env is not enough: the contract sets every other run below normal.
    done, mark = run_marking(mps_pool, tmp_path, dict(mps_pool.env, **{MPS_PRIORITY_ENV: MPS_PRIORITY_NORMAL}), "-q")
    assert done.returncode == 0, done.stderr
    assert json.loads(mark.read_text())[MPS_PRIORITY_ENV] == MPS_PRIORITY_BELOW_NORMAL
