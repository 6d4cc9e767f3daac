"""A `gpupool server` subprocess for the benchmarks (imported by the bench_*.py scripts beside it)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

URL_RE = re.compile(r"listening on (https?://\S+?:\d+)")


def start_server(
    state: Path, token_file: Path, log: Path, devices: str, env: Mapping[str, str], extra: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a server on 127.0.0.1:0 with an admin token file; (process, URL) once it says it listens."""
    args = [sys.executable, "-m", "gpupool", "server", "--listen", "127.0.0.1:0", "--state", str(state)]
    args += ["--token-file", str(token_file), "--devices", devices, *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=dict(env))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = URL_RE.search(log.read_text(errors="replace"))
        if match:
            return proc, match.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"server did not start:\n{log.read_text(errors='replace')}")
