"""runner/spawn: the command is started inside the lease's cgroup, by clone3 or, where clone3
cannot do it, by joining between fork and exec; either way as Popen would start it (own process
group, stdio only, exec errors named)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterator

import pytest
from waiting import wait_until

from gpupool.core.errors import InvalidInput
from gpupool.isolation.cgroup import V1, LeaseCgroup, freezer_parent, lease_cgroup_parent
from gpupool.isolation.env import LEASE_CGROUP_ENV
from gpupool.runner import spawn

V2_WRITABLE = pytest.mark.skipif(lease_cgroup_parent({}) is None, reason="cgroup v2 is not writable here")


@pytest.fixture(
    params=[
        pytest.param("clone3", marks=V2_WRITABLE),
        pytest.param("join-before-exec", marks=V2_WRITABLE),
        pytest.param("v1-freezer", marks=pytest.mark.skipif(freezer_parent({}) is None, reason="no v1 freezer")),
    ]
)
def cgroup(request, monkeypatch) -> Iterator[LeaseCgroup]:
    """A lease cgroup to start in: v2 by clone3, v2 joined before exec (as on a kernel or a
    seccomp filter without clone3), and the v1 freezer's (always joined before exec)."""
    if request.param == "join-before-exec":
        monkeypatch.setattr(spawn, "_clone_into", lambda *args: None)
    made = LeaseCgroup.create(f"spawn-{request.param}", {LEASE_CGROUP_ENV: V1 if request.param == "v1-freezer" else ""})
    assert made is not None
    yield made
    made.remove()


def reap(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_the_command_runs_in_the_cgroup_in_its_own_group_with_stdio_only(cgroup, tmp_path):
    out = tmp_path / "out"
    leaked_r, leaked_w = os.pipe()
    os.set_inheritable(leaked_w, True)  # what a runner could inherit from its own parent
    line = ":freezer:" if cgroup.v1 else "^0::"
    script = f"grep {line} /proc/$$/cgroup > {out}; ps -o pgid= -p $$ >> {out}; ls /proc/$$/fd >> {out}"
    try:
        child = spawn.start_in_cgroup(["sh", "-c", script], {"PATH": os.environ["PATH"]}, cgroup)
        assert reap(child.pid) == 0
    finally:
        os.close(leaked_r)
    os.close(leaked_w)  # after the look: its number is not reused meanwhile
    lines = out.read_text().split("\n")
    assert lines[0].endswith("/" + Path(cgroup.path).name), lines[0]
    assert int(lines[1]) == child.pid, "the leader of a group of its own"
    fds = {int(fd) for fd in lines[2:] if fd.strip()}
    assert {0, 1, 2} <= fds and leaked_w not in fds, fds


def test_setup_runs_before_exec_and_the_signals_are_the_defaults(cgroup, tmp_path):
    marker, ignored = tmp_path / "set-up", tmp_path / "sigign"
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        child = spawn.start_in_cgroup(
            ["sh", "-c", f"test -e {marker} && grep '^SigIgn:' /proc/self/status > {ignored}"],
            dict(os.environ),
            cgroup,
            setup=lambda: marker.touch(),
        )
    finally:
        signal.signal(signal.SIGPIPE, previous)
    assert reap(child.pid) == 0, "the set-up did not run"
    # Only what Python ignores itself is given back (as Popen's restore_signals): a signal the test
    # run inherited as ignored (SIGHUP under nohup) stays ignored, as it would through Popen.
    mask = int(ignored.read_text().split()[1], 16)
    assert not mask & (1 << (signal.SIGPIPE - 1)), "SIGPIPE stayed ignored"


@pytest.mark.parametrize(
    "name, message",
    [
        ("no-such-command-s3", "command 'no-such-command-s3' was not found: check the name or give a full path"),
        ("{tmp}/plain.txt", "command '{tmp}/plain.txt' is not executable: check its permissions"),
    ],
)
def test_a_command_that_cannot_start_is_named(cgroup, tmp_path, name, message):
    (tmp_path / "plain.txt").write_text("not a program\n")  # mode 0644
    with pytest.raises(InvalidInput) as caught:
        spawn.start_in_cgroup([name.format(tmp=tmp_path)], dict(os.environ), cgroup)
    assert caught.value.message == message.format(tmp=tmp_path)
    wait_until(lambda: not cgroup.populated(), 5, "nothing left in the cgroup")
