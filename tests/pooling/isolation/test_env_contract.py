"""The env contract computed from a lease (pure)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.isolation_mode import IsolationMode, NodeIsolation
from gpupool.core.model import Device, Holder, Lease, Slice
from gpupool.pooling.isolation import child_env, context_reserve_mib, isolation_env, shares
from gpupool.pooling.isolation import env as contract

DEVICES = [
    Device("GPU-a", 0, "A", 16384),
    Device("GPU-b", 1, "B", 81920),
]


def lease(*slices: Slice) -> Lease:
    return Lease("L1", Holder("me"), tuple(slices), 30.0, 0.0, 30.0)


MPS = NodeIsolation(IsolationMode.MPS, "/state/mps/pipe", "/state/mps/log")


def test_hooks_mode_is_the_default_and_sets_no_mps_variables():
    env = isolation_env("L1", shares(lease(Slice("GPU-a", 8192)), DEVICES), "/hook", reserve_mib=512)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "GPUPOOL_LEASE_ID": "L1",
        "GPUPOOL_MEMORY_LIMIT_MIB": "8192",
        "GPUPOOL_MEMORY_FRACTION": "0.5",
        "GPUPOOL_ALLOCATOR_LIMIT_MIB": "7680",
        "GPUPOOL_ALLOCATOR_FRACTION": "0.4687",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.4687",
        "GPUPOOL_HOOK_DIR": "/hook",
    }
    assert env == isolation_env(
        "L1",
        shares(lease(Slice("GPU-a", 8192)), DEVICES),
        "/hook",
        reserve_mib=512,
        isolation=NodeIsolation(IsolationMode.HOOKS),
    )


def test_mps_mode_adds_the_daemon_folders_and_per_client_limits_to_the_hooks():
    env = isolation_env("L1", shares(lease(Slice("GPU-a", 8192)), DEVICES), "/hook", isolation=MPS, reserve_mib=512)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "GPUPOOL_LEASE_ID": "L1",
        "GPUPOOL_MEMORY_LIMIT_MIB": "8192",
        "GPUPOOL_MEMORY_FRACTION": "0.5",
        "GPUPOOL_ALLOCATOR_LIMIT_MIB": "7680",
        "GPUPOOL_ALLOCATOR_FRACTION": "0.4687",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.4687",
        "CUDA_MPS_PIPE_DIRECTORY": "/state/mps/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/state/mps/log",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",  # the whole grant: MPS clients share one context
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_CLIENT_PRIORITY": "1",  # below normal: only a latency-sensitive lease goes first
        "GPUPOOL_HOOK_DIR": "/hook",
    }


def test_a_latency_sensitive_lease_runs_at_normal_priority_and_only_under_mps():
    gpus = shares(lease(Slice("GPU-a", 8192)), DEVICES)
    assert isolation_env("L1", gpus, isolation=MPS, latency_sensitive=True)["CUDA_MPS_CLIENT_PRIORITY"] == "0"
    hooks = isolation_env("L1", gpus, isolation=NodeIsolation(IsolationMode.HOOKS), latency_sensitive=True)
    assert not [name for name in hooks if name.startswith("CUDA_MPS_")]
    # The user's own env cannot raise its priority: the contract is applied over it.
    contract = isolation_env("L1", gpus, isolation=MPS)
    assert child_env({"CUDA_MPS_CLIENT_PRIORITY": "0"}, contract)["CUDA_MPS_CLIENT_PRIORITY"] == "1"


def test_none_mode_sets_the_devices_and_the_lease_only():
    env = isolation_env(
        "L1", shares(lease(Slice("GPU-a", 8192)), DEVICES), "/hook", isolation=NodeIsolation(IsolationMode.NONE)
    )
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-a", "GPUPOOL_LEASE_ID": "L1"}
    assert child_env({"PYTHONPATH": "/user"}, env)["PYTHONPATH"] == "/user"  # no hook on the path


def test_mps_mode_without_folders_leaves_the_driver_defaults():
    env = isolation_env(
        "L1", shares(lease(Slice("GPU-a", 8192)), DEVICES), isolation=NodeIsolation(IsolationMode.MPS), reserve_mib=0
    )
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env and "CUDA_MPS_LOG_DIRECTORY" not in env
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"


def test_memory_claim_on_unequal_gpus_keeps_visible_order():
    gpus = shares(lease(Slice("GPU-b", 8192), Slice("GPU-a", 8192)), DEVICES)
    env = isolation_env("L1", gpus, isolation=MPS, reserve_mib=0)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-b,GPU-a"
    assert env["GPUPOOL_MEMORY_FRACTION"] == "0.1,0.5"
    assert env["GPUPOOL_ALLOCATOR_FRACTION"] == "0.1,0.5"  # no reserve: the allocator gets the grant
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M,1=8192M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"  # the largest share: never starve
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1"  # the smallest: never overrun
    assert "GPUPOOL_HOOK_DIR" not in env


def test_the_context_reserve_leaves_room_and_never_goes_below_the_floor():
    half, small = shares(lease(Slice("GPU-a", 8192), Slice("GPU-b", 600)), DEVICES)
    assert half.allocator_mib(512) == 8192 - 512
    assert half.allocator_fraction(512) <= (8192 - 512) / 16384
    # Two 50 % jobs that fill their caps leave each its context's room on the device.
    assert 2 * (half.allocator_mib(512) + 512) <= 16384
    floor = round(600 * contract.MIN_ALLOCATOR_SHARE)
    assert small.allocator_mib(512) == floor
    assert small.allocator_mib(10**6) == floor


def test_the_reserve_comes_from_its_env_variable_or_the_default():
    assert context_reserve_mib({}) == contract.CONTEXT_RESERVE_MIB
    assert context_reserve_mib({"GPUPOOL_CONTEXT_RESERVE_MIB": " 300 "}) == 300
    assert context_reserve_mib({"GPUPOOL_CONTEXT_RESERVE_MIB": "0"}) == 0
    for bad in ("-1", "lots", "1.5"):
        with pytest.raises(InvalidInput, match="GPUPOOL_CONTEXT_RESERVE_MIB=") as err:
            context_reserve_mib({"GPUPOOL_CONTEXT_RESERVE_MIB": bad})
        assert repr(bad) in err.value.message and "make gpu-check" in err.value.message


def test_the_reserve_env_variable_reaches_the_contract(monkeypatch):
    monkeypatch.setenv("GPUPOOL_CONTEXT_RESERVE_MIB", "1024")
    env = isolation_env("L1", shares(lease(Slice("GPU-a", 8192)), DEVICES))
    assert env["GPUPOOL_ALLOCATOR_LIMIT_MIB"] == "7168"


def test_the_hook_reads_the_names_env_py_defines():
    """The hook cannot import gpupool; its copies of the names must match env.py's."""
    hook = Path(contract.__file__).parent / "hook" / "sitecustomize.py"
    names = {}
    for node in ast.parse(hook.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    assert names["FRACTION_ENVS"] == (contract.ALLOCATOR_FRACTION_ENV, contract.MEMORY_FRACTION_ENV)
    assert names["LIMIT_ENVS"] == (contract.ALLOCATOR_LIMIT_ENV, contract.MEMORY_LIMIT_ENV)
    assert contract.HOOK_DEBUG_ENV in hook.read_text()


def test_fractions_round_down_never_above_the_grant():
    gpus = shares(lease(Slice("GPU-a", 5462)), DEVICES)  # 1/3 of 16 GiB, rounded up by placement
    assert gpus[0].fraction <= 5462 / 16384
    assert gpus[0].fraction == 0.3333


def test_group_selects_one_request_of_a_gang():
    slices = (Slice("GPU-a", 4096, 0), Slice("GPU-b", 4096, 1))
    assert [g.uuid for g in shares(lease(*slices), DEVICES, group=1)] == ["GPU-b"]


def test_child_env_puts_hook_first_and_keeps_user_pythonpath():
    base = {"PYTHONPATH": os.pathsep.join(["/user/lib", "/hook"]), "HOME": "/h"}
    env = child_env(base, {"GPUPOOL_HOOK_DIR": "/hook", "CUDA_VISIBLE_DEVICES": "GPU-a"})
    assert env["PYTHONPATH"] == os.pathsep.join(["/hook", "/user/lib"])
    assert env["HOME"] == "/h" and env["CUDA_VISIBLE_DEVICES"] == "GPU-a"
