"""Pod annotations gpupool reads and writes, Bitfusion's included.

Read: `gpupool.io/inject` (or Bitfusion's `auto-management/bitfusion`),
`gpupool.io/filter` (or `bitfusion-client/filter`), `gpupool.io/policy`.
Written by the mutating webhook: `gpupool.io/mutated` (the idempotency marker)
and `gpupool.io/claim` (each GPU container's exact ask, for the extender). Written by the
extender's bind: `gpupool.io/choice` (the node and GPUs the share was placed on, kube.choice).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple

from ..core.errors import InvalidClaim, InvalidInput
from ..core.filters import Filter
from ..core.model import Policy
from .resources import DOMAIN, GpuAsk

INJECT = f"{DOMAIN}/inject"
FILTER = f"{DOMAIN}/filter"
POLICY = f"{DOMAIN}/policy"
MARKER = f"{DOMAIN}/mutated"
CLAIM = f"{DOMAIN}/claim"
CHOICE = f"{DOMAIN}/choice"
REQUEUE = f"{DOMAIN}/requeue"  # the extender's nudge of an unschedulable GPU pod when room frees
MARKER_VALUE = "v1"
BITFUSION_INJECT = "auto-management/bitfusion"
BITFUSION_FILTER = "bitfusion-client/filter"
# Bitfusion-only knobs gpupool has no use for: accepted, with a warning.
BITFUSION_IGNORED = ("bitfusion-client/os", "bitfusion-client/version")


def chosen_gpu_key(index: int) -> str:
    """`gpupool.io/choice.N`: the claim the runner of the pod's container number N sends (its ask
    pinned to its chosen GPUs), written with the choice; the webhook hands it to that container
    as $GPUPOOL_CLAIM (downward API)."""
    return f"{CHOICE}.{index}"


class Mode(enum.Enum):
    """How much the mutating webhook does to a pod."""

    ALL = "all"  # translate resources, inject the runner, wrap the commands
    INJECTION_ONLY = "injection-only"  # translate and inject, but leave commands alone
    NONE = "none"  # leave the pod alone


@dataclass(frozen=True)
class Injection:
    """What the pod's annotations ask of the webhook."""

    mode: Mode
    containers: Optional[FrozenSet[str]] = None  # wrap only these (None: every GPU container)

    def wraps(self, container_name: str) -> bool:
        if self.mode is not Mode.ALL:
            return False
        return self.containers is None or container_name in self.containers


_WORDS = {
    "all": Mode.ALL,
    "yes": Mode.ALL,
    "true": Mode.ALL,
    "injection-only": Mode.INJECTION_ONLY,
    "injection": Mode.INJECTION_ONLY,
    "none": Mode.NONE,
    "no": Mode.NONE,
    "false": Mode.NONE,
}


def read_injection(annotations: Mapping[str, str]) -> Injection:
    """The injection mode; a pod asking for GPUs with no annotation gets `all`."""
    raw = annotations.get(INJECT, annotations.get(BITFUSION_INJECT))
    if raw is None:
        return Injection(Mode.ALL)
    text = str(raw).strip()
    mode = _WORDS.get(text.lower())
    if mode is not None:
        return Injection(mode)
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    if not names:
        return Injection(Mode.ALL)
    return Injection(Mode.ALL, names)


def read_filters(annotations: Mapping[str, str]) -> Tuple[Filter, ...]:
    """Claim filters from `gpupool.io/filter` / `bitfusion-client/filter` (comma separated)."""
    raw = annotations.get(FILTER, annotations.get(BITFUSION_FILTER, ""))
    key = FILTER if FILTER in annotations else BITFUSION_FILTER
    try:
        return tuple(Filter.parse(part) for part in str(raw).split(",") if part.strip())
    except InvalidInput as err:  # a bad filter (InvalidClaim), a size or number out of bounds
        raise type(err)(f"annotation {key}: {err.message}") from None


def read_policy(annotations: Mapping[str, str]) -> Policy:
    try:
        return Policy.parse(annotations.get(POLICY, Policy.FRAGAWARE.value))
    except InvalidClaim as err:
        raise InvalidClaim(f"annotation {POLICY}: {err.message}") from None


def ignored_warnings(annotations: Mapping[str, str]) -> List[str]:
    return [
        f"annotation {key} is Bitfusion-only and ignored by gpupool; it can be removed"
        for key in BITFUSION_IGNORED
        if key in annotations
    ]


def encode_claim(asks: Mapping[str, GpuAsk]) -> str:
    """The `gpupool.io/claim` value: {container name: ask}, compact and sorted (stable patches)."""
    return json.dumps({n: a.to_dict() for n, a in asks.items()}, sort_keys=True, separators=(",", ":"))


def decode_claim(text: Optional[str]) -> Optional[Dict[str, GpuAsk]]:
    """Read `gpupool.io/claim` back; None when absent or unreadable (the caller falls back to units)."""
    if not text:
        return None
    try:
        data: Any = json.loads(text)
        return {str(n): GpuAsk.from_dict(a) for n, a in data.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
