"""Device inventory: NVML for real GPUs, emulated devices for tests (stdlib only).

`discover(spec, node)` is the one entry point; `health` answers whether a
device is still usable (NVML XID events) for the kube device plugin; `usage`
samples what each process uses on each GPU.

Owns: finding devices, their health and per-process usage samples.
May import: core (floor 1); nvidia-ml-py only lazily, inside functions.
"""

from .emulated import emulated_devices
from .health import HealthWatcher, device_health
from .inventory import discover, parse_spec
from .nvml import NvmlUnavailable, nvml_devices

__all__ = [
    "discover",
    "parse_spec",
    "emulated_devices",
    "nvml_devices",
    "NvmlUnavailable",
    "HealthWatcher",
    "device_health",
]
