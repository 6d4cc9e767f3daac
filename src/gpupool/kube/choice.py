"""A pod's share decided once: the extender's choice of node and GPUs, recorded on the pod.

The extender's bind verb places the pod's claim (the webhook's `gpupool.io/claim`) on the node
the scheduler picked, with core placement and the extender's learned shape mix, and writes the
answer to `gpupool.io/choice` before it binds the pod. The later steps read that annotation and
check it still holds instead of choosing again (pure functions here, no I/O): the device plugin
gives the chosen GPUs' units, and each container's runner sends the claim recorded for it in
`gpupool.io/choice.N`, pinned to those GPUs.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import InvalidInput, Unavailable
from ..core.filters import Filter
from ..core.fragmentation import Fragmentation
from ..core.model import Claim, Device, GpuRequest, Policy
from ..core.placement import place
from . import annotations as ann
from .resources import UNITS, UNITS_PER_GPU, GpuAsk, claim_of

PENDING = "Pending"  # the pod phase between binding and the start of its containers


@dataclass(frozen=True)
class Choice:
    """The node and, per GPU container, the UUIDs of the GPUs its share is on (one per GPU asked)."""

    node: str
    gpus: Mapping[str, Tuple[str, ...]]

    def encode(self) -> str:
        """The `gpupool.io/choice` value: compact, sorted (a stable patch)."""
        body = {"node": self.node, "gpus": {c: list(u) for c, u in self.gpus.items()}}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: Optional[str]) -> Optional[Choice]:
        """Read `gpupool.io/choice` back; None when absent or not one (then the step chooses itself)."""
        if not text:
            return None
        try:
            data: Any = json.loads(text)
            gpus = {str(c): tuple(str(u) for u in uuids) for c, uuids in data["gpus"].items()}
            return cls(str(data["node"]), gpus)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def pinned_requests(ask: GpuAsk, uuids: Sequence[str], filters: Sequence[Filter] = ()) -> List[GpuRequest]:
    """One request of one GPU per recorded GPU, `device.uuid` set to it (escaped: a UUID is not a
    glob) besides the pod's own `filters`: placing them verifies the choice instead of choosing."""
    one = replace(ask, amount=1)
    return [one.request([*filters, Filter("device.uuid", "=", glob.escape(u))]) for u in uuids]


def runner_claims(choice: Choice, pod: Mapping[str, Any]) -> Dict[str, str]:
    """The `gpupool.io/choice.N` annotations of `choice`: per GPU container (by its index in the
    pod), the claim its runner sends (JSON, `Claim.to_dict`): the container's ask, one request per
    chosen GPU, each pinned to it. The webhook hands it to the runner as $GPUPOOL_CLAIM."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    asks = ann.decode_claim(annotations.get(ann.CLAIM)) or {}
    filters = ann.read_filters(annotations)
    out: Dict[str, str] = {}
    for index, container in enumerate((pod.get("spec") or {}).get("containers") or []):
        name = str(container.get("name"))
        uuids, ask = choice.gpus.get(name), asks.get(name)
        if uuids and ask is not None:
            claim = Claim(tuple(pinned_requests(ask, uuids, filters)), ann.read_policy(annotations))
            out[ann.chosen_gpu_key(index)] = json.dumps(claim.to_dict(), sort_keys=True, separators=(",", ":"))
    return out


def recorded(pod: Mapping[str, Any]) -> Optional[Choice]:
    """The choice recorded on `pod` (an API Pod object), if any."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return Choice.decode(annotations.get(ann.CHOICE))


def choose(
    pod: Mapping[str, Any],
    node: str,
    devices: Sequence[Device],
    allocated: Mapping[str, int],
    frag: Optional[Fragmentation] = None,
) -> Optional[Choice]:
    """Place the pod's claim on `node`'s GPUs: its choice, None when the pod asks for no GPU.

    Raises Unavailable (the placement's reason) when the node cannot hold it now, InvalidInput
    when the pod carries no readable `gpupool.io/claim` (it did not pass the webhook).
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    asks = ann.decode_claim(annotations.get(ann.CLAIM))
    if asks is None:
        if ann.CLAIM in annotations:
            raise InvalidInput(f"annotation {ann.CLAIM} {annotations[ann.CLAIM]!r} is not the webhook's")
        return None
    names = list(asks)
    claim = claim_of([asks[n] for n in names], ann.read_filters(annotations), ann.read_policy(annotations))
    placement = place(devices, allocated, claim, frag)
    if placement.slices is None:
        raise Unavailable(f"node {node}: {placement.reason}")
    gpus: Dict[str, List[str]] = {n: [] for n in names}
    for s in placement.slices:
        gpus[names[s.group]].append(s.device_uuid)
    return Choice(node, {n: tuple(u) for n, u in gpus.items()})


def pinned_claim(pod: Mapping[str, Any]) -> Optional[Claim]:
    """The pod's claim held to the GPUs recorded for it: one request per recorded GPU, each with
    `device.uuid` set to it, so that placing it (a bound pod not yet started, counted by the
    extender) lands where the bind put it instead of choosing again. None without a usable record."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    asks = ann.decode_claim(annotations.get(ann.CLAIM))
    choice = recorded(pod)
    if asks is None or choice is None:
        return None
    requests: List[GpuRequest] = []
    for name, ask in asks.items():
        uuids = choice.gpus.get(name, ())
        if len(uuids) != ask.amount:
            return None
        requests += pinned_requests(ask, uuids)
    return Claim(tuple(requests), Policy.BINPACK) if requests else None


def gpus_for_units(pods: Iterable[Mapping[str, Any]], node: str, units: int) -> List[Tuple[str, ...]]:
    """The recorded GPUs of each GPU container of a pod bound to `node` and not started that asks
    for `units` `gpupool.io/gpu` units: what the kubelet's GetPreferredAllocation can be for.

    The kubelet does not say which pod it allocates for; a container is a candidate when its
    pod is Pending on this node with a choice and its units equal the request's.
    """
    out: List[Tuple[str, ...]] = []
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        choice = recorded(pod)
        if choice is None or choice.node != node or spec.get("nodeName") != node:
            continue
        if status.get("phase", PENDING) != PENDING:
            continue
        for container in spec.get("containers") or []:
            uuids = choice.gpus.get(str(container.get("name")))
            limits = (container.get("resources") or {}).get("limits") or {}
            if uuids and str(limits.get(UNITS, "")).strip() == str(units):
                out.append(uuids)
    return out


def per_gpu_units(units: int, gpus: int) -> Optional[int]:
    """Units to take on each of `gpus` GPUs for `units` in all (None: not an even split of at most one GPU each)."""
    if gpus <= 0 or units % gpus or units // gpus > UNITS_PER_GPU:
        return None
    return units // gpus
