"""Fixtures for real-process tests of `gpupool run`: an embedded pool in tmp_path and a CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

CLI = [sys.executable, "-m", "gpupool.cli.workload"]


class Pool:
    """An embedded pool on a tmp state dir, driven through the workload CLI."""

    def __init__(self, state: Path, devices: str) -> None:
        self.state = state
        self.devices = devices
        self.env = dict(os.environ)
        self.env.update({"GPUPOOL_STATE": str(state), "GPUPOOL_DEVICES": devices, "PYTHONUNBUFFERED": "1"})
        for name in ("GPUPOOL_SERVER", "GPUPOOL_CONFIG", "GPUPOOL_TOKEN", "GPUPOOL_CONTEXT_RESERVE_MIB", "PYTHONPATH"):
            self.env.pop(name, None)
        self.env["HOME"] = str(state.parent / "home")  # no ~/.gpupool of the developer

    def cmd(self, *args: str) -> List[str]:
        return CLI + list(args)

    def run(self, *args: str, timeout: float = 30, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.cmd(*args), env=env or self.env, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        return subprocess.Popen(
            self.cmd(*args), env=env or self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def status(self) -> dict:
        done = self.run("status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture
def pool(tmp_path: Path) -> Pool:
    """1 emulated GPU of 16 GiB."""
    return Pool(tmp_path / "state", "emulated:1x16GiB")


@pytest.fixture
def pool2(tmp_path: Path) -> Pool:
    """2 emulated GPUs of 16 GiB each."""
    return Pool(tmp_path / "state", "emulated:2x16GiB")
