"""What the release and push benchmarks read of a `gpupool run` they started (beside them)."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Optional


def sleep_pid(mark: str) -> Optional[int]:
    """The pid of the `sleep MARK` process, if it runs."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", mark.encode()]:
            return int(name)
    return None


def lease_of(runner: subprocess.Popen[str]) -> str:
    """The lease id from the runner's 'Locked ... as lease ID,' line."""
    assert runner.stderr is not None
    said = []
    while True:
        line = runner.stderr.readline()
        if not line:
            raise SystemExit("the runner ended before it held a lease:\n" + "".join(said))
        said.append(line)
        if " as lease " in line:
            return line.split(" as lease ", 1)[1].split(",", 1)[0]


def started_pid(mark: str, wait_s: float, n: int) -> int:
    """The pid of the run's `sleep MARK` once it runs; round `n` ends the benchmark without one."""
    deadline = time.monotonic() + wait_s
    pid = sleep_pid(mark)
    while pid is None and time.monotonic() < deadline:
        time.sleep(0.01)
        pid = sleep_pid(mark)
    if pid is None:
        raise SystemExit(f"round {n}: the command did not start within {wait_s:g} s")
    return pid
