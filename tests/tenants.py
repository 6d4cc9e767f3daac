"""The CLI as a tenant: `gpupool …` with a given token, for the tests of verbs that several tenants
of one server use (claim hold/cancel, the filters)."""

from __future__ import annotations

import subprocess
from typing import Dict

from gpupool_cli import gpupool


def gpupool_as(env: Dict[str, str], token: str, *argv: str) -> subprocess.CompletedProcess:
    """`python -m gpupool ARGV` in `env` with `token` as GPUPOOL_TOKEN; its output captured."""
    return gpupool(*argv, env=dict(env, GPUPOOL_TOKEN=token))
