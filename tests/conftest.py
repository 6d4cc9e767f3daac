"""Shared fixtures: a real `gpupool server` subprocess on a loopback port.

`running_server` gives a started server (2 emulated 16 GiB GPUs, admin token,
TTL 2 s); `server_factory(...)` starts more with other flags.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

_URL_RE = re.compile(r"listening on (\S+)")


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    """Send `sig`, give the process 10 s to exit, then kill it; returns its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


@dataclass
class ServerProcess:
    """A `python -m gpupool server` child: its URL, admin token, state dir and log."""

    proc: subprocess.Popen
    url: str
    state: Path
    token: Optional[str]
    log: Path
    args: List[str] = field(default_factory=list)

    def headers(self, token: Optional[str] = None) -> dict:
        token = token or self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return stop_process(self.proc, sig)


def start_server(state: Path, *extra: str, token: bool = True, timeout: float = 20.0) -> ServerProcess:
    """Start a server on 127.0.0.1:0 and wait until it prints its URL and answers /healthz."""
    import httpx

    state.mkdir(parents=True, exist_ok=True)
    log = state.parent / f"{state.name}-server-{time.monotonic_ns()}.log"
    args = [sys.executable, "-m", "gpupool", "server", "--listen", "127.0.0.1:0", "--state", str(state)]
    token_file = state.parent / f"{state.name}-token"
    if token:
        args += ["--token-file", str(token_file)]
    if not any(a.startswith("--devices") for a in extra):
        args += ["--devices", "emulated:2x16GiB"]
    args += list(extra)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    url = None
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        match = _URL_RE.search(text)
        if match:
            url = match.group(1)
            break
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{text}")
        time.sleep(0.05)
    if url is None:
        proc.kill()
        raise RuntimeError(f"server did not start:\n{log.read_text(errors='replace')}")
    verify = ssl.create_default_context(cafile=str(state / "tls" / "ca.crt")) if url.startswith("https") else True
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1, verify=verify).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    admin = token_file.read_text().strip() if token else None
    return ServerProcess(proc, url, state, admin, log, args)


@pytest.fixture
def server_factory(tmp_path) -> Iterator:
    started: List[ServerProcess] = []

    def factory(*extra: str, state: Optional[Path] = None, token: bool = True) -> ServerProcess:
        server = start_server(state or tmp_path / f"state{len(started)}", *extra, token=token)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop(signal.SIGKILL)


@pytest.fixture
def running_server(server_factory) -> ServerProcess:
    """A server with 2 emulated 16 GiB GPUs, an admin token and a 2 s default TTL."""
    return server_factory("--ttl", "2")
