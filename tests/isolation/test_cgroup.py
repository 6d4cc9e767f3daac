"""isolation/cgroup: finding cgroup v2 and our place in it, and a lease cgroup's whole life on the
real kernel (where cgroup v2 is writable): joined before exec, killed as a whole, removed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gpupool.isolation.cgroup import LeaseCgroup, cgroup2_mount, lease_cgroup_parent, own_cgroup
from gpupool.isolation.env import LEASE_CGROUP_ENV

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
    assert LeaseCgroup.create("abc", {LEASE_CGROUP_ENV: "OFF"}) is None


PARENT = lease_cgroup_parent({})
writable = pytest.mark.skipif(PARENT is None, reason="cgroup v2 is not writable here")


@writable
def test_the_parent_is_this_process_cgroup_folder():
    mount = cgroup2_mount()
    path = own_cgroup()
    assert mount is not None and path is not None and PARENT is not None
    assert Path(PARENT, "cgroup.procs").read_text().split().count(str(os.getpid())) == 1


@writable
@pytest.mark.parametrize("kill_file", [True, False], ids=["cgroup.kill", "freeze-and-kill"])
def test_a_tree_joined_before_exec_is_killed_as_a_whole_and_removed(kill_file):
    cgroup = LeaseCgroup.create("0123456789abcdef")
    assert cgroup is not None
    fd = os.open(os.path.join(cgroup.path, "cgroup.procs"), os.O_WRONLY)
    # A daemon that leaves its session and double-forks: it is in the cgroup all the same.
    script = "setsid sh -c 'sleep 300 & sleep 300' & (sleep 301 &); exec sleep 302"
    child = subprocess.Popen(["sh", "-c", script], preexec_fn=lambda: os.write(fd, b"0"))
    try:
        os.close(fd)
        deadline = time.monotonic() + 10
        while len(cgroup.pids()) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        members = cgroup.pids()
        assert child.pid in members and len(members) >= 4, members
        assert cgroup.populated()
        started = time.monotonic()
        assert cgroup.kill(kill_file=kill_file)
        assert time.monotonic() - started < 1.0
        assert not cgroup.populated() and cgroup.pids() == []
        assert child.wait(timeout=5) == -9
        assert cgroup.remove()
        assert not os.path.exists(cgroup.path)
        assert cgroup.remove(), "removing it twice is fine"
    finally:
        child.kill()
        child.wait()
        cgroup.remove()


@writable
def test_a_tree_that_forked_first_is_moved_parents_first():
    cgroup = LeaseCgroup.create("fedcba9876543210")
    assert cgroup is not None
    child = subprocess.Popen(["sh", "-c", "sleep 303 & sleep 304 & wait"])
    try:
        deadline = time.monotonic() + 10
        tree = []
        while len(tree) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
            tree = [child.pid] + [
                int(x) for x in Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()
            ]
        assert cgroup.move(tree) == tree
        assert sorted(cgroup.pids()) == sorted(tree)
        assert cgroup.move(tree) == [], "those already in it are not moved again"
        assert cgroup.remove()
        assert child.wait(timeout=5) == -9
    finally:
        child.kill()
        child.wait()
        cgroup.remove()
