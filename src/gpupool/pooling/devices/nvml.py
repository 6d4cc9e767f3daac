"""Real NVIDIA GPUs through NVML (nvidia-ml-py), imported lazily.

Missing library, missing driver or zero GPUs all raise `NvmlUnavailable`
with a message that says which, so `--devices auto` can fall back cleanly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.errors import InvalidInput
from ...core.model import Device
from ...logs import get_logger

if TYPE_CHECKING:
    from typing import Any, List

log = get_logger(__name__)


class NvmlUnavailable(InvalidInput):
    """NVML cannot list GPUs here (no nvidia-ml-py, no driver, or no GPU)."""

    code = "nvml_unavailable"


def load_nvml() -> Any:
    """Import and initialise pynvml; raise NvmlUnavailable when that is impossible."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable(
            "NVML is not installed (pip install nvidia-ml-py): use --devices emulated:2x16GiB without GPUs"
        ) from None
    try:
        pynvml.nvmlInit()
    except Exception as err:  # pynvml raises NVMLError subclasses, and OSError without libnvidia-ml
        raise NvmlUnavailable(
            f"NVML could not start ({err}): is the NVIDIA driver installed? "
            "Use --devices emulated:2x16GiB on machines without GPUs"
        ) from None
    return pynvml


def nvml_devices(node: str = "localhost") -> List[Device]:
    """The NVIDIA GPUs of this machine; NvmlUnavailable when there are none."""
    nvml = load_nvml()
    try:
        count = nvml.nvmlDeviceGetCount()
        devices = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            devices.append(
                Device(
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mib=usable_memory_mib(nvml, handle),
                    node=node,
                    healthy=True,
                )
            )
    finally:
        shutdown_nvml(nvml)
    if not devices:
        raise NvmlUnavailable("NVML found no NVIDIA GPU on this machine: use --devices emulated:2x16GiB")
    log.info("NVML: %d GPU(s): %s", len(devices), ", ".join(d.name for d in devices))
    return devices


def usable_memory_mib(nvml: Any, handle: Any) -> int:
    """MiB that processes can allocate: the total less what the driver reserves for itself.

    The pool shares this, not the total: on an H100 the driver keeps about 0.5 GiB, so shares
    of the total would overcommit the card (two halves could not both be filled).
    Drivers and pynvml releases without the v2 query answer the total.
    """
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        return int(info.total - info.reserved) // (1024 * 1024)
    except Exception:  # NVMLError_FunctionNotFound / NotSupported, AttributeError on old pynvml
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)


def shutdown_nvml(nvml: Any) -> None:
    """End a `load_nvml()`; shutdown errors are logged, never raised (they are not actionable)."""
    try:
        nvml.nvmlShutdown()
    except Exception:  # pragma: no cover
        log.debug("nvmlShutdown failed", exc_info=True)


def _text(value: Any) -> str:
    """Older pynvml versions answer bytes, newer ones str."""
    return value.decode() if isinstance(value, bytes) else str(value)
