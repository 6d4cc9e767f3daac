"""Processes a test can find by a mark in their command line (a `sleep MARK` and its runner), and
end with kill -9 at the test's end, whatever the code under test left."""

from __future__ import annotations

import itertools
import os
import signal
from typing import List

_serial = itertools.count(1)


def marker() -> str:
    """A sleep duration no other process on the machine uses: it marks the test's processes."""
    return f"1000.{os.getpid()}{next(_serial):03d}4242"


def marked(mark: str, program: str = "") -> List[int]:
    """The pids whose command line holds `mark` (zombies have none): the runner and its guard too,
    unless `program` names the one to look for (argv[0])."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        if mark.encode() in data and (not program or data.split(b"\0")[0] == program.encode()):
            found.append(int(name))
    return found


def kill_all(pids: List[int]) -> None:
    """SIGKILL each of `pids` that is still there."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
