"""The environments, emulated usage files and ports that tests give the processes they start.

One helper of each, so that what "a clean environment" means is written once:
`clean_env` (none of the developer's GPUPOOL_*), `embedded_env` (plus an embedded
pool of emulated GPUs), `write_usage` (what the emulated NVML reports per GPU and
pid), `free_port` (a port nobody listens on now) and `quiet_port` (one that
nothing else takes while a test's server is down).
"""

from __future__ import annotations

import json
import os
import random
import socket
from pathlib import Path
from typing import Dict, Mapping, Optional, Union


def clean_env(tmp_path: Optional[Path] = None, *, drop: str = "GPUPOOL_", **extra: str) -> Dict[str, str]:
    """This process's environment without any variable starting with `drop` (by default none of
    the developer's GPUPOOL_* server, token, state or config); HOME is tmp_path/home (where no
    ~/.gpupool lies) when `tmp_path` is given; plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    if tmp_path is not None:
        env["HOME"] = str(tmp_path / "home")
    env.update(extra)
    return env


def embedded_env(tmp_path: Path, devices: str, **extra: str) -> Dict[str, str]:
    """A clean environment (HOME tmp_path/home) with an embedded pool of `devices` in
    tmp_path/state, no server, no config; plus `extra`."""
    return clean_env(tmp_path, GPUPOOL_STATE=str(tmp_path / "state"), GPUPOOL_DEVICES=devices, **extra)


def write_usage(path: Path, usage: Mapping[str, Mapping[Union[int, str], int]]) -> None:
    """Replace the emulated usage file at `path` at once (GPU uuid -> pid -> MiB), so that a
    sampler never reads half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({uuid: {str(pid): mib for pid, mib in rows.items()} for uuid, rows in usage.items()}))
    os.replace(tmp, path)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (the kernel's pick of an ephemeral one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quiet_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999), for a server that is killed and
    started again on it: nothing that binds port 0 while it is down (another test's) can take it."""
    while True:
        port = random.randint(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
