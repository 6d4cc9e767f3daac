"""What NVML knows of a GPU beyond the pool's Device: the driver version and the CUDA compute
capability, as ResourceSlice attributes. Emulated GPUs (and nodes without NVML) have none."""

from __future__ import annotations

import logging
from typing import Dict, Mapping, Sequence

from ...core.model import Device
from ...pooling.devices.health import is_emulated

log = logging.getLogger(__name__)


def nvml_attributes(devices: Sequence[Device]) -> Dict[str, Mapping[str, str]]:
    """{uuid: {"driverVersion": ..., "cudaComputeCapability": "9.0"}} for the real GPUs NVML can read."""
    real = [d.uuid for d in devices if not is_emulated(d.uuid)]
    if not real:
        return {}
    from ...pooling.devices.nvml import NvmlUnavailable, load_nvml, shutdown_nvml

    try:
        nvml = load_nvml()
    except NvmlUnavailable as err:
        log.warning("no NVML attributes for the ResourceSlice: %s", err)
        return {}
    out: Dict[str, Mapping[str, str]] = {}
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        for uuid in real:
            attrs = {"driverVersion": driver}
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
                attrs["cudaComputeCapability"] = f"{major}.{minor}"
            except Exception as err:  # NVMLError subclasses: not supported, GPU lost
                log.debug("no compute capability for %s: %s", uuid, err)
            out[uuid] = attrs
    except Exception as err:  # pragma: no cover - a driver that fails mid-query
        log.warning("NVML attributes for the ResourceSlice failed: %s", err)
    finally:
        shutdown_nvml(nvml)
    return out


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
