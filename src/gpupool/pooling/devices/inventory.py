"""Resolve a device spec ('auto', 'nvml', 'emulated:2x16GiB', env GPUPOOL_DEVICES) to devices."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput
from ...core.model import Device
from ...logs import get_logger
from ..isolation.env import DEVICES_ENV as ENV  # its one definition
from .emulated import PREFIX, emulated_devices
from .nvml import NvmlUnavailable, nvml_devices

if TYPE_CHECKING:
    from typing import List, Optional, Tuple

log = get_logger(__name__)


def parse_spec(spec: Optional[str]) -> Tuple[str, Optional[str]]:
    """Split a spec into (kind, fallback): kind is 'nvml' or an emulated spec.

    'auto' = NVML with no fallback; 'auto,emulated:1x16GiB' (or 'auto|emulated:...')
    falls back to the emulated devices only when NVML has none, because a
    silent fallback would hide a broken driver on a real GPU node.
    """
    text = (spec or "").strip()
    if not text or text.lower() in ("auto", "nvml"):
        return "nvml", None
    lowered = text.lower()
    for sep in ("|", ","):
        head = f"auto{sep}"
        if lowered.startswith(head):
            rest = text[len(head) :].strip()
            if not rest.lower().startswith(PREFIX):
                raise InvalidInput(f"device spec {spec!r}: after 'auto{sep}' give an emulated fallback")
            return "nvml", rest
    if lowered.startswith(PREFIX):
        return text, None
    raise InvalidInput(f"device spec {spec!r} is unknown: use auto, nvml, emulated:2x16GiB or emulated:2x16GiB,1x80GiB")


def discover(spec: Optional[str] = None, node: Optional[str] = None) -> List[Device]:
    """The devices named by `spec` (default: env GPUPOOL_DEVICES, else 'auto' = NVML).

    Raises NvmlUnavailable (an InvalidInput) when NVML is asked for and there
    is no GPU, naming the emulated option.
    """
    node = node or os.uname().nodename  # gethostname(2)
    spec = spec if spec is not None else os.environ.get(ENV)
    kind, fallback = parse_spec(spec)
    if kind != "nvml":
        return emulated_devices(kind, node)
    try:
        return nvml_devices(node)
    except NvmlUnavailable as err:
        if fallback is None:
            raise
        log.warning("%s; using %s", err.message, fallback)
        return emulated_devices(fallback, node)
