"""The post-import hook, for real: child Pythons with the hook dir first on PYTHONPATH."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest

from gpupool.pooling.isolation import write_hook_dir

FAKE_TORCH = """
import json, os
_calls = []
def _record(*args):
    with open(os.environ["FAKE_RECORD"], "a") as f:
        f.write(json.dumps(args) + "\\n")
class cuda:
    _queued = []
    @staticmethod
    def is_available():
        if os.environ.get("FAKE_BROKEN"):
            raise RuntimeError("driver exploded")
        return True
    @staticmethod
    def device_count():
        return 2
    @staticmethod
    def is_initialized():
        return False
    @staticmethod
    def _lazy_call(fn):
        cuda._queued.append(fn)
    @staticmethod
    def init():
        for fn in cuda._queued:
            fn()
    @staticmethod
    def set_per_process_memory_fraction(fraction, device):
        _record("fraction", fraction, device)
"""

FAKE_TF = """
import json, os
def _record(*args):
    with open(os.environ["FAKE_RECORD"], "a") as f:
        f.write(json.dumps(args) + "\\n")
class _Config:
    class LogicalDeviceConfiguration:
        def __init__(self, memory_limit):
            self.memory_limit = memory_limit
    def list_physical_devices(self, kind):
        return ["/physical_device:GPU:0", "/physical_device:GPU:1"] if kind == "GPU" else []
    def set_logical_device_configuration(self, gpu, configs):
        _record("logical", gpu, [c.memory_limit for c in configs])
config = _Config()
"""


@pytest.fixture
def hook_env(tmp_path: Path) -> Dict[str, str]:
    hook = write_hook_dir(tmp_path / "hook")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "FAKE_"))}
    env.update(
        PYTHONPATH=str(hook),
        GPUPOOL_HOOK_DEBUG="1",
        GPUPOOL_MEMORY_FRACTION="0.5,0.25",
        GPUPOOL_MEMORY_LIMIT_MIB="8192,4096",
        FAKE_RECORD=str(tmp_path / "calls.jsonl"),
    )
    return env


def python(code: str, env: Dict[str, str], extra_path: str = "") -> subprocess.CompletedProcess:
    env = dict(env)
    if extra_path:
        env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + extra_path
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60
    )


def calls(env: Dict[str, str]):
    path = Path(env["FAKE_RECORD"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def fake_package(root: Path, name: str, source: str) -> str:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(source)
    return str(root)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (CPU build is enough)")
def test_real_cpu_torch_import_runs_the_hook_and_skips_without_cuda(hook_env):
    done = python("import torch; print(torch.ones(2).sum().item())", hook_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2.0"
    assert "gpupool-hook: installed" in done.stderr
    assert "gpupool-hook: torch: skipped (no CUDA); would set memory fraction 0.5,0.25" in done.stderr


def test_torch_with_cuda_gets_a_fraction_per_visible_gpu_at_cuda_init(hook_env, tmp_path):
    fake = fake_package(tmp_path / "fake", "torch", FAKE_TORCH)
    done = python("import torch\nassert not torch.cuda._queued == []\ntorch.cuda.init()", hook_env, fake)
    assert done.returncode == 0, done.stderr
    assert "queued for CUDA initialisation" in done.stderr
    assert calls(hook_env) == [["fraction", 0.5, 0], ["fraction", 0.25, 1]]


def test_the_allocator_caps_win_over_the_grant(hook_env, tmp_path):
    """The contract's allocator caps (grant less the CUDA context reserve) are what the frameworks get."""
    hook_env.update(GPUPOOL_ALLOCATOR_FRACTION="0.4687,0.2187", GPUPOOL_ALLOCATOR_LIMIT_MIB="7680,3584")
    fake = fake_package(tmp_path / "fake", "torch", FAKE_TORCH)
    fake_package(tmp_path / "fake", "tensorflow", FAKE_TF)
    done = python("import torch, tensorflow\ntorch.cuda.init()", hook_env, fake)
    assert done.returncode == 0, done.stderr
    assert sorted(calls(hook_env)) == sorted(
        [
            ["fraction", 0.4687, 0],
            ["fraction", 0.2187, 1],
            ["logical", "/physical_device:GPU:0", [7680]],
            ["logical", "/physical_device:GPU:1", [3584]],
        ]
    )
    assert "installed (fractions=0.4687,0.2187, limits_mib=7680,3584)" in done.stderr


def test_submodule_import_triggers_the_hook_too(hook_env, tmp_path):
    fake = fake_package(tmp_path / "fake", "torch", FAKE_TORCH)
    (tmp_path / "fake" / "torch" / "nn.py").write_text("X = 1\n")
    done = python("from torch import nn\nimport torch\ntorch.cuda.init()", hook_env, fake)
    assert done.returncode == 0, done.stderr
    assert len(calls(hook_env)) == 2


def test_tensorflow_gets_a_logical_device_with_the_memory_limit(hook_env, tmp_path):
    fake = fake_package(tmp_path / "fake", "tensorflow", FAKE_TF)
    done = python("import tensorflow as tf", hook_env, fake)
    assert done.returncode == 0, done.stderr
    assert calls(hook_env) == [
        ["logical", "/physical_device:GPU:0", [8192]],
        ["logical", "/physical_device:GPU:1", [4096]],
    ]


def test_a_failing_hook_never_breaks_the_import(hook_env, tmp_path):
    fake = fake_package(tmp_path / "fake", "torch", FAKE_TORCH)
    hook_env["FAKE_BROKEN"] = "1"
    done = python("import torch; print('imported')", hook_env, fake)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"
    assert "torch: hook failed" in done.stderr


def test_without_frameworks_python_is_untouched_and_quiet(hook_env):
    hook_env.pop("GPUPOOL_HOOK_DEBUG")
    done = python("import json, sqlite3; print('ok')", hook_env)
    assert done.returncode == 0 and done.stdout.strip() == "ok"
    assert done.stderr == ""


def test_an_existing_sitecustomize_still_runs(hook_env, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    done = python("import os; print(os.environ.get('CHAINED'))", hook_env, str(other))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "yes"
