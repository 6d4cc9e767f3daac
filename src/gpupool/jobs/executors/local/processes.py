"""Start replica processes in their own process groups, and stop them without orphans.

Each replica leads a new session (so a terminal's Ctrl-C or the supervisor's
death does not reach it by accident, and one killpg reaches its whole tree).
Every replica also carries GPUPOOL_JOB_DIR in its env; `sweep` finds any
process that left its group (a daemonised grandchild) by that marker.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import IO, Iterable, List, Mapping, Optional, Sequence

from ....pooling.isolation.proctree import terminate
from ...environment import JOB_DIR_ENV


def start(
    command: Sequence[str], env: Mapping[str, str], log: IO[bytes], cwd: Optional[str]
) -> subprocess.Popen[bytes]:
    """Start `command` as the leader of a new session, stdout and stderr into `log`."""
    return subprocess.Popen(
        list(command),
        env=dict(env),
        cwd=cwd or None,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to process group `pgid`; False when no such group exists."""
    if pgid <= 1:
        return False  # never signal our own group or init by a zero/unset pid
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    return signal_group(pgid, 0)


def stop_groups(pgids: Iterable[int], grace_s: float = 5.0, children: Sequence[subprocess.Popen[bytes]] = ()) -> None:
    """SIGTERM every group, wait up to `grace_s` for them to go, then SIGKILL what is left
    (isolation.proctree.terminate, the one process stop).

    `children` are our own Popen leaders: polling them reaps them, since an
    unreaped (zombie) leader still counts as a live group member.
    """
    terminate((), grace_s, groups=pgids, reap=lambda: [child.poll() for child in children])
    for child in children:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def marked_processes(job_dir: Path) -> List[int]:
    """Pids of this user's processes whose env holds GPUPOOL_JOB_DIR=`job_dir`."""
    marker = f"{JOB_DIR_ENV}={job_dir}".encode()
    found: List[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or another user's process
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(job_dir: Path) -> List[int]:
    """SIGKILL every process still marked with `job_dir`; returns their pids."""
    pids = marked_processes(job_dir)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return pids
