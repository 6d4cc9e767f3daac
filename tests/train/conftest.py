"""Shared fixtures for the trainer tests: a real (small) data set, exported once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]


def gpupool_cmd(*args: str) -> List[str]:
    """The `gpupool` command line, through the interpreter running the tests."""
    return [sys.executable, "-m", "gpupool.cli.main", *args]


def run_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """A child environment: no inherited distributed variables, one thread per process
    (the suite runs on 2 cores), plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gpupool(*args: str, timeout: float = 240, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run a gpupool command to completion and capture its output."""
    return subprocess.run(gpupool_cmd(*args), capture_output=True, text=True, timeout=timeout, env=run_env(env))


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits as DIR/<digit>/*.png (1,797 images)."""
    pytest.importorskip("sklearn")
    pytest.importorskip("PIL")
    from gpupool.train.digits import export_digits

    root = tmp_path_factory.mktemp("digits")
    export_digits(root)
    return root


@pytest.fixture(scope="session")
def small_digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 digits per class: for tests about mechanics, not accuracy."""
    pytest.importorskip("sklearn")
    from gpupool.train.digits import export_digits

    root = tmp_path_factory.mktemp("digits_small")
    export_digits(root, limit_per_class=30)
    return root
