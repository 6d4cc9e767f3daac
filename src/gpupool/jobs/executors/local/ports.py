"""Free TCP ports for local jobs, reserved in the state dir so two jobs never collide.

The kernel's "bind to port 0" is not enough: a port is free when picked but
the replica binds it seconds later, and another job (or an outgoing
connection from the ephemeral range) may take it in between. So ports come
from a range below the usual ephemeral range, are checked bindable, and are
recorded per job in a flock-guarded file until the job ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
from pathlib import Path
from typing import Callable, Dict, Iterator, List

from ....core.errors import Unavailable

PORT_RANGE = (20000, 32000)  # below Linux's default ephemeral range 32768-60999
REGISTRY = "ports.json"


@contextlib.contextmanager
def _locked_registry(jobs_dir: Path) -> Iterator[Dict[str, str]]:
    """The {port: job} map, read and written back under an exclusive lock."""
    jobs_dir.mkdir(parents=True, exist_ok=True)
    path = jobs_dir / REGISTRY
    with open(jobs_dir / (REGISTRY + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data: Dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            data = {}  # a torn file only loses reservations of jobs that are checked again below
        yield data
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def reserve(
    jobs_dir: Path,
    job: str,
    count: int,
    is_live: Callable[[str], bool] = lambda job: True,
    host: str = "127.0.0.1",
) -> List[int]:
    """Reserve `count` distinct free ports for `job`, dropping reservations of dead jobs first.

    Args:
        jobs_dir: the directory holding every job's state (shared by all jobs).
        is_live: whether a job holding reservations still runs; dead jobs' ports are reused.
    """
    with _locked_registry(jobs_dir) as taken:
        for key, owner in list(taken.items()):  # the registry's keys are ports as strings (JSON)
            if owner != job and not is_live(owner):
                del taken[key]
        for key in [k for k, owner in taken.items() if owner == job]:
            del taken[key]  # a restarted supervisor picks again
        rng = random.Random()
        chosen: List[int] = []
        for _ in range(2000):
            if len(chosen) == count:
                break
            port = rng.randrange(*PORT_RANGE)
            if str(port) in taken or port in chosen or not _bindable(port, host):
                continue
            chosen.append(port)
        if len(chosen) < count:
            raise Unavailable(f"could not find {count} free ports in {PORT_RANGE[0]}-{PORT_RANGE[1]}; end some jobs")
        for port in chosen:
            taken[str(port)] = job
        return chosen


def release(jobs_dir: Path, job: str) -> None:
    """Forget every port reserved by `job`."""
    with _locked_registry(jobs_dir) as taken:
        for port in [p for p, owner in taken.items() if owner == job]:
            del taken[port]


def reserved(jobs_dir: Path) -> Dict[int, str]:
    """The current reservations, {port: job}."""
    with _locked_registry(jobs_dir) as taken:
        return {int(p): j for p, j in taken.items()}
