"""The env contract computed from a lease (pure)."""

from __future__ import annotations

import os

from gpupool.core.model import Device, Holder, Lease, Slice
from gpupool.isolation import child_env, isolation_env, shares

DEVICES = [
    Device("GPU-a", 0, "A", 16384),
    Device("GPU-b", 1, "B", 81920),
]


def lease(*slices: Slice) -> Lease:
    return Lease("L1", Holder("me"), tuple(slices), 30.0, 0.0, 30.0)


def test_fraction_claim_on_one_gpu():
    env = isolation_env("L1", shares(lease(Slice("GPU-a", 8192)), DEVICES), "/hook")
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "GPUPOOL_LEASE_ID": "L1",
        "GPUPOOL_MEMORY_LIMIT_MIB": "8192",
        "GPUPOOL_MEMORY_FRACTION": "0.5",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
        "GPUPOOL_HOOK_DIR": "/hook",
    }


def test_memory_claim_on_unequal_gpus_keeps_visible_order():
    gpus = shares(lease(Slice("GPU-b", 8192), Slice("GPU-a", 8192)), DEVICES)
    env = isolation_env("L1", gpus)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-b,GPU-a"
    assert env["GPUPOOL_MEMORY_FRACTION"] == "0.1,0.5"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M,1=8192M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"  # the largest share: never starve
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1"  # the smallest: never overrun
    assert "GPUPOOL_HOOK_DIR" not in env


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
