"""A daemon that re-forks from its first millisecond does not outlive its lease (issue 34, item 3).

The command's first act is `env -i python hopper.py`: it daemonises at once (fork, setsid, fork)
and then forks a successor every half millisecond, each process exiting after its fork, and it
rewrites a stamp file as it goes. Before the fix the guard moved the command's tree into the
lease's cgroup 0.1 s after the start: the hopper was never listed in time, and it ran its full
lifetime after a kill -9 of the runner and after a normal exit. Now the command is born in the
cgroup, and the end of the lease freezes it before it signals the members.

Real processes throughout; the lease's cgroup must be writable (root, or a delegated subtree).
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
from marked import marked
from waiting import wait_until

from gpupool.pooling.isolation.cgroup import NAME_PREFIX, V1, freezer_parent
from gpupool.pooling.isolation.env import LEASE_CGROUP_ENV

from .test_lease_end import CGROUP_PARENT, env_for

FREEZER_PARENT = freezer_parent({})
# The lease's cgroup in each hierarchy that is writable here: cgroup v2, and the v1 freezer (what a
# host without a writable v2 gets; GPUPOOL_LEASE_CGROUP=v1 takes it here).
HIERARCHIES = [
    pytest.param("v2", marks=pytest.mark.skipif(CGROUP_PARENT is None, reason="cgroup v2 is not writable here")),
    pytest.param(V1, marks=pytest.mark.skipif(FREEZER_PARENT is None, reason="no writable v1 freezer here")),
]

HOPPER = Path(__file__).with_name("hopper.py")
# The hopper stops by itself after this long: long enough that surviving the lease shows.
LIFETIME_S = 40
# How long the hopper may take to be gone after the lease ends: a condition, not a speed
# (benchmarks/bench_fork_escape.py measures the speed).
GONE_WAIT_S = 10.0
# The hopper is gone once its stamp has not changed for this long (it rewrites it every 10 ms).
STILL_S = 0.5


def run_env(pool, tmp_path: Path, hierarchy: str) -> Dict[str, str]:
    env = env_for(pool, "cgroup", tmp_path)
    if hierarchy == V1:
        env[LEASE_CGROUP_ENV] = V1
    return env


def cgroups_of(runner_pid: int, hierarchy: str) -> List[Path]:
    """The lease cgroups a runner made (named after its pid, in this test's own cgroup)."""
    parent = FREEZER_PARENT if hierarchy == V1 else CGROUP_PARENT
    return list(Path(parent).glob(f"{NAME_PREFIX}*-{runner_pid}")) if parent else []


def hopper_command(stamp: Path, hold: bool) -> List[str]:
    """The hopper as the command's very first act; the command then waits until it has stamped
    (it hops by then), and with `hold` it goes on running (a sleep) until the runner is killed."""
    hop = f"env -i {shlex.quote(sys.executable)} {shlex.quote(str(HOPPER))} {shlex.quote(str(stamp))} {LIFETIME_S}"
    started = f"while [ ! -s {shlex.quote(str(stamp))} ]; do sleep 0.01; done"
    return ["sh", "-c", f"{hop}; {started}" + ("; exec sleep 600" if hold else "")]


def hoppers(stamp: Path) -> List[int]:
    """The hopper's live processes (its command line names the stamp file; the shell's too, but
    its argv[0] is not the interpreter)."""
    return marked(str(stamp), sys.executable)


def stop(stamp: Path) -> None:
    """Have a hopper that escaped stop by itself (its pids cannot be listed in time to kill)."""
    Path(f"{stamp}.stop").touch()


def assert_gone_for_good(stamp: Path) -> None:
    """The stamp the hopper rewrites every 10 ms stops changing (within GONE_WAIT_S) and no hopper
    process is left. The stamp is the hopper's sign of life: no pid of it lives long enough for a
    look at /proc to be sure it found them all."""
    seen = {"stamp": stamp.read_text(), "since": time.monotonic()}

    def still() -> bool:
        now = stamp.read_text()
        if now != seen["stamp"]:
            seen.update(stamp=now, since=time.monotonic())
        return time.monotonic() - float(seen["since"]) >= STILL_S

    wait_until(still, GONE_WAIT_S, f"the hopper's stamp unchanged for {STILL_S:g} s", interval=0.02)
    assert not hoppers(stamp)


@pytest.mark.parametrize("hierarchy", HIERARCHIES)
def test_a_hopper_started_first_is_gone_after_a_kill_9_of_the_runner(pool, tmp_path, hierarchy):
    stamp = tmp_path / "stamp"
    env = run_env(pool, tmp_path, hierarchy)
    runner = pool.start("run", "-p", "0.5", "--ttl", "30", "--", *hopper_command(stamp, hold=True), env=env)
    try:
        wait_until(lambda: stamp.exists() and hoppers(stamp), 20, "the hopper started")
        first = stamp.read_text()
        wait_until(lambda: stamp.read_text() != first, 10, "the hopper hops")
        assert runner.poll() is None, runner.communicate()[1]
        runner.kill()
        runner.wait(timeout=5)
        assert_gone_for_good(stamp)
        wait_until(lambda: not cgroups_of(runner.pid, hierarchy), GONE_WAIT_S, "the guard removed the lease's cgroup")
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=10)
        stop(stamp)


@pytest.mark.parametrize("hierarchy", HIERARCHIES)
def test_a_hopper_started_first_is_gone_after_a_normal_exit(pool, tmp_path, hierarchy):
    stamp = tmp_path / "stamp"
    env = run_env(pool, tmp_path, hierarchy)
    runner = pool.start("run", "-q", "-p", "0.5", "--", *hopper_command(stamp, hold=False), env=env)
    try:
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == 0, err
        assert stamp.exists(), "the hopper never started"
        assert_gone_for_good(stamp)
        assert not cgroups_of(runner.pid, hierarchy), "the lease's cgroup was left behind"
        assert pool.status()["leases"] == []
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=10)
        stop(stamp)


@pytest.mark.parametrize("hierarchy", HIERARCHIES)
def test_a_hopper_started_first_is_gone_after_a_release(pool, tmp_path, hierarchy):
    """The release reaches the runner (its watch, or at worst its next heartbeat, a third of the
    TTL), which ends the lease's cgroup, frozen while signalled."""
    stamp = tmp_path / "stamp"
    env = run_env(pool, tmp_path, hierarchy)
    runner = pool.start("run", "-p", "0.5", "--ttl", "6", "--", *hopper_command(stamp, hold=True), env=env)
    try:
        wait_until(lambda: stamp.exists() and hoppers(stamp), 20, "the hopper started")
        leases = pool.status()["leases"]
        assert len(leases) == 1, leases
        released = pool.run("release", leases[0]["id"], env=env)
        assert released.returncode == 0, released.stderr
        assert_gone_for_good(stamp)
        runner.communicate(timeout=30)
        assert runner.returncode != 0
        assert not cgroups_of(runner.pid, hierarchy), "the lease's cgroup was left behind"
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=10)
        stop(stamp)
