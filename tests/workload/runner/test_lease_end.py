"""A lease's processes end with it, whatever they do (issue 23, item 5): env scrubbing, setsid, a
double fork and a renamed command, with the runner killed by SIGKILL; once in the lease's own
cgroup (where cgroup v2 is writable) and once with the guard as their subreaper alone.

Each test marks its processes with a unique sleep duration and looks for it in /proc/*/cmdline:
the processes hide their lease id, group and parent, not their command line.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from marked import kill_all, marked, marker
from waiting import wait_until

from gpupool.pooling.isolation.cgroup import NAME_PREFIX, OFF, lease_cgroup_parent
from gpupool.pooling.isolation.env import LEASE_CGROUP_ENV
from gpupool.workload.runner.workdir import PREFIX

CGROUP_PARENT = lease_cgroup_parent()
MODES = [
    pytest.param(
        "cgroup",
        marks=pytest.mark.skipif(CGROUP_PARENT is None, reason="cgroup v2 is not writable here (no lease cgroup)"),
    ),
    "subreaper",
]


def cgroup_of(pid: int) -> Optional[str]:
    """The cgroup v2 path of `pid` (the '0::' line), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    return next((line[3:] for line in lines if line.startswith("0::")), None)


def env_for(pool, mode: str, tmp_path: Path) -> Dict[str, str]:
    env = dict(pool.env)
    env[LEASE_CGROUP_ENV] = "auto" if mode == "cgroup" else OFF
    # The runner's private folder lands here, where the test can look for it.
    env.pop("XDG_RUNTIME_DIR", None)
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env


def cgroups_of(runner_pid: int) -> List[Path]:
    """The lease cgroups a runner made (named after its pid, in this test's cgroup: its own)."""
    return list(Path(CGROUP_PARENT).glob(f"{NAME_PREFIX}*-{runner_pid}")) if CGROUP_PARENT else []


def in_lease_cgroup(pid: int) -> bool:
    return (cgroup_of(pid) or "/").rsplit("/", 1)[-1].startswith(NAME_PREFIX)


def check_placement(pids: List[int], mode: str) -> None:
    """In the cgroup mode every process is in the lease's cgroup from its start (the command is
    born there, and so is all it forks); in the other, none is in one."""
    if mode == "cgroup":
        assert all(in_lease_cgroup(pid) for pid in pids), {pid: cgroup_of(pid) for pid in pids}
        assert len({cgroup_of(pid) for pid in pids} - {None}) == 1
    else:
        assert not any(in_lease_cgroup(pid) for pid in pids)


# How long the guard may take to remove the lease's cgroup after the runner's kill -9: a
# condition, not a speed (a loaded 2-core CI machine took over 2 s once).
CLEANUP_WAIT_S = 30.0

# Each holds the runner's command running until it is killed, and leaves processes behind that
# hide from a sweep by process group and by GPUPOOL_LEASE_ID.
SHAPES = {
    # The issue's command; -w keeps util-linux setsid in the foreground (as a group leader it would
    # fork and return at once, and the runner would end the tree at a normal exit).
    "setsid-sh": lambda m: ["env", "-u", "GPUPOOL_LEASE_ID", "setsid", "-w", "sh", "-c", f"sleep {m} & sleep {m}"],
    # A renamed daemon: its own session, no lease id, and the command itself exec'd into a sleep.
    "renamed": lambda m: ["sh", "-c", f"env -u GPUPOOL_LEASE_ID setsid sleep {m} & exec sleep {m}"],
    # A double fork: the daemon's parent exits at once, the daemon is re-parented.
    "double-fork": lambda m: ["sh", "-c", f"(env -u GPUPOOL_LEASE_ID setsid sleep {m} &); exec sleep {m}"],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_kill_9_of_the_runner_leaves_nothing_of_the_lease(pool, tmp_path, mode, shape):
    mark = marker()
    env = env_for(pool, mode, tmp_path)
    runner = pool.start("run", "-p", "0.5", "--ttl", "30", "--", *SHAPES[shape](mark), env=env)
    pids: List[int] = []
    try:
        wait_until(lambda: len(marked(mark, "sleep")) >= 2, 15, "the command and its daemon started")
        pids = marked(mark, "sleep")
        check_placement(pids, mode)
        assert runner.poll() is None, runner.communicate()[1]
        assert list((tmp_path / "tmp").glob(PREFIX + "*")), "the runner's folder was not where expected"
        runner.kill()
        runner.wait(timeout=5)
        wait_until(lambda: not marked(mark), CLEANUP_WAIT_S, f"every process of the lease ended ({marked(mark)} left)")
        wait_until(lambda: not cgroups_of(runner.pid), CLEANUP_WAIT_S, "the guard removed the lease's cgroup")
        # Issue 23 item 8: the runner's private folder goes with it.
        wait_until(
            lambda: not list((tmp_path / "tmp").glob(PREFIX + "*")), CLEANUP_WAIT_S, "the runner's folder removed"
        )
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=10)
        kill_all(pids + marked(mark))


@pytest.mark.parametrize("mode", MODES)
def test_a_kill_9_soon_after_the_start_leaves_nothing(pool, tmp_path, mode):
    """The runner killed at moments soon after its command started, while its daemon may still
    be forking: every process ends all the same."""
    env = env_for(pool, mode, tmp_path)
    for delay in (0.0, 0.005, 0.01, 0.02, 0.05, 0.08, 0.1, 0.15):
        mark = marker()
        runner = pool.start("run", "-q", "-m", "1", "--", *SHAPES["double-fork"](mark), env=env)
        try:
            wait_until(lambda m=mark: len(marked(m, "sleep")) >= 2, 15, "the command and its daemon started")
            time.sleep(delay)  # the kill lands this far into the command's start (the delays sweep it)
            runner.kill()
            runner.wait(timeout=5)
            wait_until(lambda m=mark: not marked(m), CLEANUP_WAIT_S, f"every process ended, killed {delay:g} s in")
            wait_until(lambda r=runner: not cgroups_of(r.pid), CLEANUP_WAIT_S, "the guard removed the lease's cgroup")
        finally:
            if runner.poll() is None:
                runner.kill()
            runner.wait(timeout=10)
            kill_all(marked(mark))


@pytest.mark.parametrize("mode", MODES)
def test_the_issues_command_leaves_nothing_after_a_kill_9(pool, tmp_path, mode):
    """Literally the issue's: util-linux setsid forks and its first process exits at once, so the
    runner may be ending the tree itself (a normal exit) when it is killed; nothing may remain."""
    mark = marker()
    command = ["env", "-u", "GPUPOOL_LEASE_ID", "setsid", "sh", "-c", f"sleep {mark} & sleep {mark}"]
    runner = pool.start("run", "-p", "0.5", "--", *command, env=env_for(pool, mode, tmp_path))
    try:
        wait_until(lambda: len(marked(mark, "sleep")) >= 2 or runner.poll() is not None, 15, "the daemon started")
        runner.kill()
        runner.wait(timeout=5)
        wait_until(lambda: not marked(mark), CLEANUP_WAIT_S, f"every process of the lease ended ({marked(mark)} left)")
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=10)
        kill_all(marked(mark))


@pytest.mark.parametrize("mode", MODES)
def test_the_issues_command_at_a_normal_exit_leaves_nothing(pool, tmp_path, mode):
    """The daemon forks while the runner ends the tree (its first process exits at once): one look
    at /proc missed the sleeps in 8 of 60 runs before issue 23; the runner now looks until none is
    left (and the lease's cgroup, where there is one, leaves no choice)."""
    env = env_for(pool, mode, tmp_path)
    marks = [marker() for _ in range(15)]
    try:
        for mark in marks:
            command = ["env", "-u", "GPUPOOL_LEASE_ID", "setsid", "sh", "-c", f"sleep {mark} & sleep {mark}"]
            done = pool.run("run", "-q", "-m", "1", "--", *command, env=env)
            assert done.returncode == 0, done.stderr
            assert marked(mark) == [], f"left running after a normal exit: {marked(mark)}"
    finally:
        kill_all([pid for mark in marks for pid in marked(mark)])


@pytest.mark.parametrize("mode", MODES)
def test_normal_exit_ends_the_daemon_releases_and_leaves_no_cgroup(pool, tmp_path, mode):
    mark = marker()
    stop = tmp_path / "stop"
    script = f"env -u GPUPOOL_LEASE_ID setsid sleep {mark} & while [ ! -e {stop} ]; do sleep 0.02; done; exit 3"
    runner = pool.start("run", "-p", "0.5", "--", "sh", "-c", script, env=env_for(pool, mode, tmp_path))
    pids: List[int] = []
    try:
        wait_until(lambda: marked(mark, "sleep"), 15, "the daemon started")
        pids = marked(mark, "sleep")
        check_placement(pids, mode)
        path = cgroup_of(pids[0])
        stop.touch()
        _, err = runner.communicate(timeout=15)
        assert runner.returncode == 3, err
        assert marked(mark) == [], "the daemon (or the guard) outlived the runner"
        assert "Released GPUs on 1 servers" in err
        assert pool.status()["leases"] == []
        if mode == "cgroup":
            # The runner's cgroup is this test's: the lease's is a folder in CGROUP_PARENT.
            assert CGROUP_PARENT is not None and path is not None
            assert not (Path(CGROUP_PARENT) / path.rsplit("/", 1)[-1]).exists(), f"cgroup {path} left behind"
        assert not list((tmp_path / "tmp").glob(PREFIX + "*"))
    finally:
        stop.touch()
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=10)
        kill_all(pids + marked(mark))


@pytest.mark.skipif(CGROUP_PARENT is None, reason="cgroup v2 is not writable here (no lease cgroup)")
def test_a_command_that_cannot_start_leaves_no_cgroup_and_no_lease(pool, tmp_path):
    runner = pool.start("run", "-p", "0.5", "--", "no-such-command-h2", env=env_for(pool, "cgroup", tmp_path))
    _, err = runner.communicate(timeout=30)
    assert runner.returncode == 2, err
    assert "command 'no-such-command-h2' was not found: check the name or give a full path" in err
    assert "Traceback" not in err
    assert not cgroups_of(runner.pid)
    assert pool.status()["leases"] == []
    assert not list((tmp_path / "tmp").glob(PREFIX + "*"))
