"""runner/spawn: the command is started inside the lease's cgroup, by clone3 or, where clone3
cannot do it, by joining between fork and exec; either way as Popen would start it (own process
group, stdio only, exec errors named).

Each start runs in a fresh interpreter with no other thread, as in the guard: the clone3 child
runs Python between clone and exec without the interpreter's after-fork bookkeeping, which a
lock held by another thread of the test run (a session's cluster fixture, a log reader) could
deadlock; it did, once in a loaded full run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from waiting import wait_until

from gpupool.pooling.isolation.cgroup import V1, LeaseCgroup, freezer_parent, lease_cgroup_parent
from gpupool.pooling.isolation.env import LEASE_CGROUP_ENV

V2_WRITABLE = pytest.mark.skipif(lease_cgroup_parent({}) is None, reason="cgroup v2 is not writable here")


@pytest.fixture(
    params=[
        pytest.param("clone3", marks=V2_WRITABLE),
        pytest.param("join-before-exec", marks=V2_WRITABLE),
        pytest.param("v1-freezer", marks=pytest.mark.skipif(freezer_parent({}) is None, reason="no v1 freezer")),
    ]
)
def cgroup(request) -> Iterator[LeaseCgroup]:
    """A lease cgroup to start in: v2 by clone3, v2 joined before exec (as on a kernel or a
    seccomp filter without clone3), and the v1 freezer's (always joined before exec)."""
    made = LeaseCgroup.create(f"spawn-{request.param}", {LEASE_CGROUP_ENV: V1 if request.param == "v1-freezer" else ""})
    assert made is not None
    made.no_clone3 = request.param == "join-before-exec"  # type: ignore[attr-defined]
    yield made
    made.remove()


# Starts the command as the guard does, reaps it, prints what the test checks (one JSON line).
STARTER = """
import json, os, signal, sys
from pathlib import Path
from gpupool.core.errors import InvalidInput
from gpupool.pooling.isolation.cgroup import LeaseCgroup
from gpupool.workload.runner import spawn
a = json.loads(sys.argv[1])
if a["no_clone3"]:
    spawn._clone_into = lambda *args: None
leaked = None
if a["leak"]:
    leaked = os.pipe()[1]
    os.set_inheritable(leaked, True)  # what a runner could inherit from its own parent
signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python starts: the command must get it back
setup = (lambda: Path(a["marker"]).touch()) if a["marker"] else None
try:
    child = spawn.start_in_cgroup(a["command"], os.environ, LeaseCgroup(a["path"], a["v1"]), setup=setup)
except InvalidInput as err:
    print(json.dumps({"error": err.message}))
    sys.exit()
_, status = os.waitpid(child.pid, 0)
print(json.dumps({"pid": child.pid, "code": os.waitstatus_to_exitcode(status), "leaked": leaked}))
"""


def start(cgroup: LeaseCgroup, command: List[str], marker: Optional[Path] = None, leak: bool = False) -> Dict[str, Any]:
    """`spawn.start_in_cgroup(command)` in a fresh interpreter with no other thread, as the guard."""
    args = {"command": command, "path": cgroup.path, "v1": cgroup.v1, "marker": str(marker) if marker else None}
    args.update(no_clone3=getattr(cgroup, "no_clone3", False), leak=leak)
    done = subprocess.run(
        [sys.executable, "-c", STARTER, json.dumps(args)], capture_output=True, text=True, timeout=120, check=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_command_runs_in_the_cgroup_in_its_own_group_with_stdio_only(cgroup, tmp_path):
    out = tmp_path / "out"
    line = ":freezer:" if cgroup.v1 else "^0::"
    script = f"grep {line} /proc/$$/cgroup > {out}; ps -o pgid= -p $$ >> {out}; ls /proc/$$/fd >> {out}"
    child = start(cgroup, ["sh", "-c", script], leak=True)
    assert child["code"] == 0
    lines = out.read_text().split("\n")
    assert lines[0].endswith("/" + Path(cgroup.path).name), lines[0]
    assert int(lines[1]) == child["pid"], "the leader of a group of its own"
    fds = {int(fd) for fd in lines[2:] if fd.strip()}
    assert {0, 1, 2} <= fds and child["leaked"] not in fds, fds


def test_setup_runs_before_exec_and_the_signals_are_the_defaults(cgroup, tmp_path):
    marker, ignored = tmp_path / "set-up", tmp_path / "sigign"
    child = start(cgroup, ["sh", "-c", f"test -e {marker} && grep '^SigIgn:' /proc/self/status > {ignored}"], marker)
    assert child["code"] == 0, "the set-up did not run"
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
    assert start(cgroup, [name.format(tmp=tmp_path)]) == {"error": message.format(tmp=tmp_path)}
    wait_until(lambda: not cgroup.populated(), 5, "nothing left in the cgroup")
