"""Shared fixtures for the trainer tests: a real (small) data set, exported once."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Dict, Optional

import pytest
from gpupool_cli import gpupool

REPO = Path(__file__).resolve().parents[2]


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


def run_gpupool(*args: str, timeout: float = 240, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run a gpupool command to completion and capture its output."""
    return gpupool(*args, env=run_env(env), timeout=timeout)


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
