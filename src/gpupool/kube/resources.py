"""The Kubernetes resource model: what a pod asks for, and what the node advertises.

A node advertises `gpupool.io/gpu` in units of 1 % of one GPU (100 per GPU).
Users write `gpupool.io/gpu-amount` + `gpu-percent` (or `gpu-memory`); the
mutating webhook turns that into `amount x percent` units so that plain
ResourceQuota on `requests.gpupool.io/gpu` works. Bitfusion's `bitfusion.io/*`
names are read as aliases so its pod specs migrate unchanged.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import InvalidInput
from ..core.filters import Filter
from ..core.model import Claim, GpuRequest, Policy
from ..core.quantity import BYTE, parse_memory_mib

DOMAIN = "gpupool.io"
UNITS = f"{DOMAIN}/gpu"  # what the device plugin advertises: 1 unit = 1 % of a GPU
UNITS_PER_GPU = 100
AMOUNT = f"{DOMAIN}/gpu-amount"
PERCENT = f"{DOMAIN}/gpu-percent"
MEMORY = f"{DOMAIN}/gpu-memory"
USER_KEYS = (AMOUNT, PERCENT, MEMORY)
KNOWN_KEYS = (UNITS,) + USER_KEYS
# Bitfusion's names, read as aliases of ours.
ALIASES = {
    "bitfusion.io/gpu-amount": AMOUNT,
    "bitfusion.io/gpu-percent": PERCENT,
    "bitfusion.io/gpu-memory": MEMORY,
}


@dataclass(frozen=True)
class GpuAsk:
    """One container's GPU ask: `amount` GPUs, each with `percent` % or `memory_mib` MiB."""

    amount: int
    percent: Optional[int] = None
    memory_mib: Optional[int] = None

    def units(self, gpu_memory_mib: Optional[int]) -> int:
        """`gpupool.io/gpu` units: amount x percent; memory is rounded up against `gpu_memory_mib`."""
        if self.percent is not None:
            return self.amount * self.percent
        if not gpu_memory_mib:
            raise InvalidInput(
                f"{MEMORY}: the webhook does not know the GPU size to turn {self.memory_mib}MiB into "
                f"{UNITS} units; use {PERCENT} instead, or start the webhook with --gpu-memory"
            )
        if self.memory_mib is None:  # neither percent nor memory: no ask read_ask makes (was a TypeError below)
            raise TypeError("a GpuAsk needs percent or memory_mib")
        per_gpu = min(UNITS_PER_GPU, math.ceil(self.memory_mib * UNITS_PER_GPU / gpu_memory_mib))
        return self.amount * per_gpu

    def request(self, filters: Sequence[Filter] = ()) -> GpuRequest:
        """The core GpuRequest this ask means."""
        if self.percent is not None:
            return GpuRequest(self.amount, fraction=self.percent / 100, filters=tuple(filters))
        return GpuRequest(self.amount, memory_mib=self.memory_mib, filters=tuple(filters))

    def limits(self) -> Dict[str, str]:
        """The container `resources.limits` a user (or a job manifest) writes for this ask."""
        share = {PERCENT: str(self.percent)} if self.percent is not None else {MEMORY: f"{self.memory_mib}Mi"}
        return {AMOUNT: str(self.amount), **share}

    @classmethod
    def of_request(cls, request: GpuRequest) -> GpuAsk:
        """The ask for a core GpuRequest; a fraction becomes whole percent, rounded up
        (the webhook's unit is 1 % of a GPU), filters are left out."""
        if request.fraction is not None:
            return cls(request.count, percent=max(1, math.ceil(request.fraction * 100 - 1e-9)))
        return cls(request.count, memory_mib=request.memory_mib)

    def to_dict(self) -> Dict[str, Any]:
        return {"amount": self.amount, "percent": self.percent, "memory_mib": self.memory_mib}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuAsk:
        return cls(int(data["amount"]), data.get("percent"), data.get("memory_mib"))

    @classmethod
    def from_units(cls, units: int) -> GpuAsk:
        """Best reading of bare `gpupool.io/gpu` units: whole GPUs, or one GPU's share."""
        if units > UNITS_PER_GPU and units % UNITS_PER_GPU == 0:
            return cls(units // UNITS_PER_GPU, percent=100)
        return cls(1, percent=min(units, UNITS_PER_GPU))


def claim_of(asks: Sequence[GpuAsk], filters: Sequence[Filter] = (), policy: Policy = Policy.FRAGAWARE) -> Claim:
    """One claim for a pod: one request per GPU container, placed all together on one node."""
    return Claim(tuple(a.request(filters) for a in asks), policy)


def gpu_keys(resources: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The gpupool-related entries of a requests/limits map, Bitfusion aliases renamed.

    Also returns unknown `gpupool.io/` keys as they are, for the validator to name.
    """
    out: Dict[str, Any] = {}
    for key, value in (resources or {}).items():
        name = ALIASES.get(key, key)
        if name.startswith(DOMAIN + "/"):
            out[name] = value
    return out


def read_ask(container: Mapping[str, Any]) -> Tuple[Optional[GpuAsk], List[str]]:
    """The container's GPU ask (None when it asks for no GPU) and the problems found.

    Limits win over requests (extended resources must be equal in both anyway).
    Every problem names the field and the fix; the ask is None when there is one.
    """
    name = container.get("name", "?")
    res = container.get("resources") or {}
    merged = dict(gpu_keys(res.get("requests")), **gpu_keys(res.get("limits")))
    errors: List[str] = []
    where = f"container {name!r}"
    for key in merged:
        if key not in KNOWN_KEYS:
            errors.append(
                f"{where}: resource {key!r} is unknown; use {AMOUNT} with {PERCENT} (1-100) or {MEMORY} (e.g. 8Gi)"
            )
    if not any(k in merged for k in USER_KEYS):
        return None, errors
    if PERCENT in merged and MEMORY in merged:
        errors.append(f"{where}: give {PERCENT} or {MEMORY}, not both; remove one of them")
    amount = _whole(
        merged.get(AMOUNT, 1),
        f"{where}: {AMOUNT}",
        errors,
        low=1,
        high=None,
        fix="use a whole number of GPUs >= 1, e.g. 1",
    )
    percent = memory = None
    if PERCENT in merged:
        percent = _whole(
            merged[PERCENT],
            f"{where}: {PERCENT}",
            errors,
            low=1,
            high=100,
            fix="use a whole percent of each GPU from 1 to 100, e.g. 50",
        )
    elif MEMORY in merged:
        memory = _memory_mib(merged[MEMORY], f"{where}: {MEMORY}", errors)
    else:
        percent = 100  # gpu-amount alone means whole GPUs
    if errors or amount is None:  # _whole gives None only with an error
        return None, errors
    return GpuAsk(amount, percent, memory), errors


def _whole(value: Any, what: str, errors: List[str], low: int, high: Optional[int], fix: str) -> Optional[int]:
    text = str(value).strip()
    if not re.fullmatch(r"\+?\d+", text):
        errors.append(f"{what} {value!r} is not a whole number; {fix}")
        return None
    number = int(text)
    if number < low or (high is not None and number > high):
        errors.append(f"{what} {value!r} is out of range; {fix}")
        return None
    return number


def _memory_mib(value: Any, what: str, errors: List[str]) -> Optional[int]:
    """A Kubernetes quantity ('8Gi', '8192Mi', '16G', bare bytes) in whole MiB (core.quantity's rules)."""
    try:
        return parse_memory_mib(value, what, bare=BYTE)
    except InvalidInput as err:
        errors.append(err.message)
        return None


def parse_units(value: Any) -> Optional[int]:
    """A `gpupool.io/gpu` quantity as an int, or None when it is not a whole number."""
    text = str(value).strip()
    return int(text) if re.fullmatch(r"\+?\d+", text) else None


def asks_for_gpu(container: Mapping[str, Any]) -> bool:
    """Whether any gpupool (or Bitfusion) resource appears in the container's requests or limits."""
    res = container.get("resources") or {}
    return bool(gpu_keys(res.get("requests")) or gpu_keys(res.get("limits")))
