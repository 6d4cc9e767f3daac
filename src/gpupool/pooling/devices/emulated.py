"""Emulated GPUs for machines without NVIDIA hardware, and for tests.

Spec grammar: ``emulated:2x16GiB`` or ``emulated:2x16GiB,1x80GiB`` (COUNTxSIZE,
count optional). UUIDs are ``GPU-emu-<node>-<index>`` so a restarted pool on
the same node sees the same devices and its stored leases still match.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput
from ...core.model import Device
from ...core.quantity import format_mib, parse_memory_mib

if TYPE_CHECKING:
    from typing import List

PREFIX = "emulated:"
_PART_RE = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?(.+?)\s*$")
# A guard against typos such as 10000x16GiB eating the machine's memory in placement loops.
MAX_DEVICES = 4096


def emulated_devices(spec: str, node: str = "localhost") -> List[Device]:
    """Devices for 'emulated:2x16GiB,1x80GiB' (the 'emulated:' prefix is optional)."""
    body = spec[len(PREFIX) :] if spec.lower().startswith(PREFIX) else spec
    devices: List[Device] = []
    for part in body.split(","):
        if not part.strip():
            continue
        match = _PART_RE.match(part)
        if not match:  # pragma: no cover - the regex accepts any non-empty text
            raise InvalidInput(f"device spec {part!r} is not COUNTxSIZE: use e.g. emulated:2x16GiB")
        count = int(match.group(1) or 1)
        memory = parse_memory_mib(match.group(2), what=f"device spec {part.strip()!r} size")
        if count < 1:
            raise InvalidInput(f"device spec {part.strip()!r}: count must be >= 1, e.g. emulated:2x16GiB")
        for _ in range(count):
            index = len(devices)
            devices.append(
                Device(
                    uuid=f"GPU-emu-{_safe(node)}-{index}",
                    index=index,
                    name=f"Emulated GPU {format_mib(memory)}",
                    memory_mib=memory,
                    node=node,
                    healthy=True,
                )
            )
            if len(devices) > MAX_DEVICES:
                raise InvalidInput(f"device spec {spec!r} asks for more than {MAX_DEVICES} emulated GPUs")
    if not devices:
        raise InvalidInput(f"device spec {spec!r} names no devices: use e.g. emulated:2x16GiB")
    return devices


def _safe(node: str) -> str:
    """Node names go into UUIDs, which end up in CUDA_VISIBLE_DEVICES: keep them plain."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", node) or "localhost"
