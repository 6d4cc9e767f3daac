"""Device inventory: emulated specs, NVML absence, health."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.pooling.devices import device_health, discover, emulated_devices, parse_spec
from gpupool.pooling.devices.nvml import NvmlUnavailable


def test_emulated_list_and_stable_uuids():
    devices = discover("emulated:2x16GiB,1x80GiB", node="n1")
    assert [d.memory_mib for d in devices] == [16384, 16384, 81920]
    assert [d.uuid for d in devices] == ["GPU-emu-n1-0", "GPU-emu-n1-1", "GPU-emu-n1-2"]
    assert discover("emulated:2x16GiB,1x80GiB", node="n1") == devices
    assert emulated_devices("1x512MiB", node="my node")[0].uuid == "GPU-emu-my-node-0"
    names = [d.name for d in emulated_devices("1x16GiB,1x1536MiB,1x512MiB")]
    assert names == ["Emulated GPU 16GiB", "Emulated GPU 1.5GiB", "Emulated GPU 512MiB"]


def test_env_spec(monkeypatch):
    monkeypatch.setenv("GPUPOOL_DEVICES", "emulated:3x8GiB")
    assert len(discover(node="n")) == 3


@pytest.mark.parametrize("spec", ["emulated:", "emulated:2xlots", "gpus:2", "emulated:0x16GiB"])
def test_bad_specs(spec):
    with pytest.raises(InvalidInput):
        discover(spec, node="n")


def test_parse_spec():
    assert parse_spec("auto") == ("nvml", None)
    assert parse_spec(None) == ("nvml", None)
    assert parse_spec("auto,emulated:1x8GiB") == ("nvml", "emulated:1x8GiB")
    assert parse_spec("emulated:1x8GiB") == ("emulated:1x8GiB", None)


def _has_gpu() -> bool:
    try:
        discover("nvml", node="n")
        return True
    except NvmlUnavailable:
        return False


@pytest.mark.skipif(_has_gpu(), reason="this machine has NVIDIA GPUs")
def test_auto_without_gpus_is_a_clear_error_or_falls_back():
    with pytest.raises(NvmlUnavailable, match="emulated"):
        discover("auto", node="n")
    assert len(discover("auto,emulated:1x8GiB", node="n")) == 1


def test_health():
    assert device_health(["GPU-emu-n-0"]) == {"GPU-emu-n-0": True}
    if not _has_gpu():
        assert device_health(["GPU-1234"]) == {"GPU-1234": False}


def test_devices_import_with_stdlib_only():
    """devices/ must not pull in third-party modules at import time."""
    code = (
        "import sys; import gpupool.pooling.devices, gpupool.pooling.pool, gpupool.pooling.store; "
        "bad = [m for m in ('pynvml', 'fastapi', 'pydantic', 'uvicorn', 'yaml') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


class _Memory:
    def __init__(self, total: int, reserved: int = 0) -> None:
        self.total, self.reserved = total, reserved


class _NvmlV2:
    """The two memory queries of pynvml, as an H100 answers them (81,559 MiB, 0.5 GiB reserved)."""

    nvmlMemory_v2 = 0x02000028

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is None:
            return _Memory(81559 << 20)
        assert version == self.nvmlMemory_v2
        return _Memory(81559 << 20, reserved=512 << 20)


class _NvmlV1(_NvmlV2):
    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is not None:
            raise RuntimeError("function not found")  # an old driver
        return _Memory(81559 << 20)


def test_the_pool_shares_what_processes_can_allocate_not_the_driver_reserve():
    from gpupool.pooling.devices.nvml import usable_memory_mib

    assert usable_memory_mib(_NvmlV2(), object()) == 81559 - 512
    assert usable_memory_mib(_NvmlV1(), object()) == 81559
