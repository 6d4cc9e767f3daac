"""isolation/cgroup: finding cgroup v2 (and the v1 freezer) and our place in it, and a lease
cgroup's whole life on the real kernel, in each hierarchy that is writable here: joined before
exec, frozen, killed as a whole, removed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import holds, wait_until

from gpupool.pooling.isolation.cgroup import (
    V1,
    LeaseCgroup,
    cgroup2_mount,
    freezer_mount,
    freezer_parent,
    lease_cgroup_parent,
    own_cgroup,
)
from gpupool.pooling.isolation.env import LEASE_CGROUP_ENV

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# A container's view: its own subtree of the host's hierarchy, at a path with a space in it.
SUBTREE = "1201 1190 0:29 /kubepods/pod1 /sys/fs/my\\040cgroup ro,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_the_cgroup2_mount_is_found_in_mountinfo(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(HYBRID)
    assert cgroup2_mount(str(info)) == ("/sys/fs/cgroup/unified", "/")
    info.write_text(SUBTREE)
    assert cgroup2_mount(str(info)) == ("/sys/fs/my cgroup", "/kubepods/pod1")
    info.write_text(HYBRID.replace("cgroup2 cgroup2", "cgroup cgroup"))
    assert cgroup2_mount(str(info)) is None
    assert cgroup2_mount(str(tmp_path / "missing")) is None


def test_the_v1_freezer_mount_is_found_in_mountinfo(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(HYBRID)
    assert freezer_mount(str(info)) is None, "memory is not the freezer"
    info.write_text(HYBRID + "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n")
    assert freezer_mount(str(info)) == ("/sys/fs/cgroup/freezer", "/")
    info.write_text("37 31 0:34 / /sys/fs/cgroup/cpu,freezer rw - cgroup cgroup rw,cpu,freezer\n")
    assert freezer_mount(str(info)) == ("/sys/fs/cgroup/cpu,freezer", "/")


def test_own_cgroup_in_the_freezer_hierarchy(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("6:freezer:/user/x\n4:memory:/y\n0::/\n")
    assert own_cgroup(str(proc), controller="freezer") == "/user/x"
    proc.write_text("6:cpu,freezer:/z\n0::/\n")
    assert own_cgroup(str(proc), controller="freezer") == "/z"
    assert own_cgroup(str(proc), controller="memory") is None
    assert own_cgroup(str(proc)) == "/"


def test_own_cgroup_reads_the_v2_line_only(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/process_api/x\n0::/user.slice/session-3.scope\n")
    assert own_cgroup(str(proc)) == "/user.slice/session-3.scope"
    proc.write_text("4:memory:/x\n")
    assert own_cgroup(str(proc)) is None
    proc.write_text("0::/gone (deleted)\n")
    assert own_cgroup(str(proc)) is None


def test_the_off_switch_keeps_a_lease_out_of_a_cgroup():
    assert lease_cgroup_parent({LEASE_CGROUP_ENV: "off"}) is None
    assert freezer_parent({LEASE_CGROUP_ENV: "off"}) is None
    assert LeaseCgroup.create("abc", {LEASE_CGROUP_ENV: "OFF"}) is None


PARENT = lease_cgroup_parent({})
FREEZER_PARENT = freezer_parent({})
writable = pytest.mark.skipif(PARENT is None, reason="cgroup v2 is not writable here")
# Each hierarchy a lease cgroup can be made in here: v2, and the v1 freezer (what a host without
# a writable v2 gets; LEASE_CGROUP_ENV=v1 takes it here).
HIERARCHIES = [
    pytest.param("v2", marks=writable),
    pytest.param(V1, marks=pytest.mark.skipif(FREEZER_PARENT is None, reason="no writable v1 freezer here")),
]


def make(lease_id: str, hierarchy: str) -> LeaseCgroup:
    cgroup = LeaseCgroup.create(lease_id, {LEASE_CGROUP_ENV: hierarchy})
    assert cgroup is not None
    assert cgroup.v1 is (hierarchy == V1)
    assert cgroup.path.startswith((FREEZER_PARENT if cgroup.v1 else PARENT) or "?")
    return cgroup


@writable
def test_the_parent_is_this_process_cgroup_folder():
    mount = cgroup2_mount()
    path = own_cgroup()
    assert mount is not None and path is not None and PARENT is not None
    assert Path(PARENT, "cgroup.procs").read_text().split().count(str(os.getpid())) == 1


@pytest.mark.parametrize("hierarchy", HIERARCHIES)
@pytest.mark.parametrize("kill_file", [True, False], ids=["cgroup.kill", "freeze-and-kill"])
def test_a_tree_joined_before_exec_is_killed_as_a_whole_and_removed(kill_file, hierarchy):
    cgroup = make("0123456789abcdef", hierarchy)
    fd = os.open(os.path.join(cgroup.path, "cgroup.procs"), os.O_WRONLY)
    # A daemon that leaves its session and double-forks: it is in the cgroup all the same.
    script = "setsid sh -c 'sleep 300 & sleep 300' & (sleep 301 &); exec sleep 302"
    child = subprocess.Popen(["sh", "-c", script], preexec_fn=lambda: os.write(fd, b"0"))
    try:
        os.close(fd)
        members = wait_until(lambda: len(cgroup.pids()) >= 4 and cgroup.pids(), 30, "4 processes in the cgroup")
        assert child.pid in members, members
        assert cgroup.populated()
        started = time.monotonic()
        # emptied (True) within a settle no loaded machine outlasts; how soon is printed, not bounded
        assert cgroup.kill(settle_s=30, kill_file=kill_file)
        print(f"the cgroup was empty {time.monotonic() - started:.3f} s after the kill")
        assert not cgroup.populated() and cgroup.pids() == []
        assert child.wait(timeout=30) == -9
        assert cgroup.remove()
        assert not os.path.exists(cgroup.path)
        assert cgroup.remove(), "removing it twice is fine"
    finally:
        child.kill()
        child.wait()
        cgroup.remove()


@pytest.mark.parametrize("hierarchy", HIERARCHIES)
@pytest.mark.parametrize("graceful", [True, False], ids=["terminate", "freeze-and-kill-each"])
def test_a_tree_that_forks_all_the_time_ends_at_once(tmp_path, graceful, hierarchy):
    """A member that forks a successor every half millisecond (and exits) has no pid that lives
    long enough to be listed and signalled: frozen first, every member is signalled."""
    cgroup = make("a0b1c2d3e4f5", hierarchy)
    stamp = tmp_path / "stamp"
    fd = os.open(os.path.join(cgroup.path, "cgroup.procs"), os.O_WRONLY)
    hopper = Path(__file__).parents[2] / "workload" / "runner" / "hopper.py"
    child = subprocess.Popen([sys.executable, str(hopper), str(stamp), "60"], preexec_fn=lambda: os.write(fd, b"0"))
    try:
        os.close(fd)
        wait_until(lambda: stamp.exists() and stamp.read_text(), 20, "the hopper hops")
        assert child.wait(timeout=10) == 0, "the hopper's first process exits at once"
        assert cgroup.populated()
        if graceful:
            assert cgroup.terminate(0.5)
        else:
            assert cgroup.kill(kill_file=False)
        assert not cgroup.populated()
        last = stamp.read_text()
        assert cgroup.remove()
        # ten of its stamps and more: it stamps every 10 ms while any member lives
        holds(lambda: stamp.read_text() == last, 0.2, "the hopper hops no more", detail=stamp.read_text)
    finally:
        Path(f"{stamp}.stop").touch()
        cgroup.remove()


@pytest.mark.parametrize("hierarchy", HIERARCHIES)
def test_terminate_gives_a_grace_then_kills(hierarchy):
    cgroup = make("graceful", hierarchy)
    fd = os.open(os.path.join(cgroup.path, "cgroup.procs"), os.O_WRONLY)
    # One member ends at SIGTERM, the other ignores it and needs the SIGKILL.
    polite = subprocess.Popen(["sleep", "300"], preexec_fn=lambda: os.write(fd, b"0"))
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 301"], preexec_fn=lambda: os.write(fd, b"0"))
    try:
        os.close(fd)
        wait_until(lambda: len(cgroup.pids()) >= 3, 10, "the members started")
        assert cgroup.terminate(0.3)
        assert polite.wait(timeout=5) == -15
        assert stubborn.wait(timeout=5) == -9
        state = ("freezer.state", "THAWED") if cgroup.v1 else ("cgroup.events", "frozen 0")
        assert state[1] in Path(cgroup.path, state[0]).read_text(), "thawed after the end"
    finally:
        for child in (polite, stubborn):
            child.kill()
            child.wait()
        cgroup.remove()
