"""The CLI as a tenant: `gpupool …` with a given token, for the tests of verbs that several tenants
of one server use (claim hold/cancel, the filters)."""

from __future__ import annotations

import subprocess
import sys
from typing import Dict


def gpupool_as(env: Dict[str, str], token: str, *argv: str) -> subprocess.CompletedProcess:
    """`python -m gpupool ARGV` in `env` with `token` as GPUPOOL_TOKEN; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "gpupool", *argv],
        env=dict(env, GPUPOOL_TOKEN=token),
        capture_output=True,
        text=True,
        timeout=60,
    )
