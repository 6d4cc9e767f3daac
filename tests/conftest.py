"""Shared fixtures: a real `gpupool server` subprocess on a loopback port, a stand-in MPS control binary.

`s3_server` / `s3_bucket` give a local S3 API (moto's server mode on loopback) and a fresh bucket.
`running_server` gives a started server (2 emulated 16 GiB GPUs, admin token,
TTL 60 s); `server_factory(...)` starts more with other flags; `fake_mps` puts a
stand-in `nvidia-cuda-mps-control` first on PATH.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest
from envs import clean_env
from waiting import tail, wait_until

_URL_RE = re.compile(r"listening on (\S+)")


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """The `cluster` tests last (otherwise in their order): the control plane they share lives from
    the first of them to the end of the session, and then runs beside no other test (its threads
    and processes would load the rest of the run)."""
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)


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

    def hold_whole_gpus(self, count: int) -> List[str]:
        """`count` whole GPUs held by admin leases of the longest TTL (the pool full for claims to
        wait); their lease ids."""
        import httpx

        from gpupool.core.model import MAX_TTL_S

        ids = []
        for _ in range(count):
            answer = httpx.post(
                f"{self.url}/v1/leases",
                json={"claim": {"requests": [{"count": 1, "fraction": 1.0}]}, "ttl_s": MAX_TTL_S},
                headers=self.headers(),
            )
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        return ids

    def make_tokens(self, *names: str) -> Dict[str, str]:
        """A tenant token per name, made by the admin; name -> token."""
        import httpx

        tokens = {}
        for name in names:
            answer = httpx.post(f"{self.url}/v1/tokens", json={"name": name}, headers=self.headers())
            assert answer.status_code == 201, answer.text
            tokens[name] = answer.json()["token"]
        return tokens

    def client_env(self, tmp_path: Path) -> Dict[str, str]:
        """The env of a `gpupool run` against this server: none of the developer's GPUPOOL_* or
        ~/.gpupool, no embedded pool of its own, the admin token."""
        return clean_env(
            tmp_path, GPUPOOL_STATE=str(tmp_path / "no-embedded"), PYTHONUNBUFFERED="1", GPUPOOL_TOKEN=self.token or ""
        )


def start_server(state: Path, *extra: str, token: bool = True, timeout: float = 60.0) -> ServerProcess:
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

    def listening() -> Optional[str]:
        text = log.read_text(errors="replace")
        match = _URL_RE.search(text)
        if match is None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{text}")
        return match.group(1) if match else None

    try:
        url = wait_until(listening, timeout, "the server's URL in its log", detail=lambda: tail(log))
        verify = ssl.create_default_context(cafile=str(state / "tls" / "ca.crt")) if url.startswith("https") else True

        def healthy() -> bool:
            try:
                return httpx.get(url + "/healthz", timeout=1, verify=verify).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout, f"{url}/healthz to answer 200", detail=lambda: tail(log))
    except AssertionError:
        proc.kill()
        proc.wait()
        raise
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
    """A server with 2 emulated 16 GiB GPUs, an admin token and a 60 s default TTL: a lease a test
    holds outlives its checks however slow the machine; a test of expiry asks for a short TTL."""
    return server_factory("--ttl", "60")


# The stand-in control binary (benchmarks/mps_stand_in.py, which the CPU benchmarks install too),
# with its interpreter line.
STAND_IN = "#!PYTHON\n" + (Path(__file__).resolve().parents[1] / "benchmarks" / "mps_stand_in.py").read_text()


@pytest.fixture
def fake_mps(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """A stand-in control binary first on PATH; yields the folder where its daemons record themselves.

    Every daemon it recorded (and its stand-in MPS server) is ended after the test: a daemon has its
    own session, so a server killed with kill -9 leaves it running, as the real one does.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    from gpupool.pooling.isolation.mps import MPS_CONTROL

    binary = bin_dir / MPS_CONTROL
    binary.write_text(STAND_IN.replace("PYTHON", sys.executable))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-should-not-reach-the-daemon")
    from gpupool.pooling.isolation import mps

    monkeypatch.setattr(mps, "BACKOFF_START_S", 0.05)
    yield record
    from gpupool.pooling.isolation.proctree import alive

    pids = [int(p.stem) for p in record.glob("*.json")]
    pids += [int(p.read_text()) for p in record.glob("server-*.pid") if p.read_text().strip().isdigit()]
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


class S3Server:
    """A local S3 API (moto's server mode on a loopback port) and the env that points s3fs at it."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        # AWS_ENDPOINT_URL is botocore's own setting: s3fs, the trainer's children and the
        # benchmark all find the server the way a real deployment finds a non-AWS endpoint.
        self.env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 for the whole session (skips where moto or s3fs is absent)."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield S3Server(f"http://{host}:{port}")
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh, empty bucket on the local server, its s3:// URL; this process and its children
    reach the server through the environment."""
    import uuid

    import fsspec

    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir(bucket)
    return f"s3://{bucket}"
