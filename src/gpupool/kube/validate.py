"""The validating webhook's decision: allow or deny a pod, with a message naming the field and the fix.

Runs after the mutating webhook, so it sees translated pods (units plus the
`gpupool.io/claim` annotation) and untranslated ones (injection `none`, or the
mutating webhook was down and ignored) alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Sequence

from ..core.errors import InvalidInput
from ..core.model import Claim, Device
from ..core.placement import place
from ..core.quantity import format_mib
from . import annotations as ann
from .extender import pod_claim
from .mutate import init_container_errors
from .resources import AMOUNT, UNITS, UNITS_PER_GPU, USER_KEYS, parse_units, read_ask


@dataclass
class Verdict:
    allowed: bool
    message: str = ""
    warnings: List[str] = field(default_factory=list)


def validate(pod: Mapping[str, Any], node_devices: Callable[[], Sequence[Sequence[Device]]] = lambda: ()) -> Verdict:
    """Allow or deny `pod`.

    Args:
        node_devices: the GPUs of each known node (empty when unknown: size checks are skipped).
    """
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    errors: List[str] = list(init_container_errors(spec))
    if any(key == ann.CHOICE or key.startswith(ann.CHOICE + ".") for key in annotations):
        # Only the extender's bind writes it, after admission: on a new pod it is forged or copied,
        # and the device plugin and the extender would trust it.
        errors.append(
            f"annotations {ann.CHOICE} and {ann.CHOICE}.N are written by gpupool's scheduler extender when "
            "it binds the pod; remove them from the pod (or its template)"
        )
    mode = ann.read_injection(annotations).mode
    translated = bool(annotations.get(ann.MARKER))
    any_gpu = False
    for c in spec.get("containers") or []:
        ask, problems = read_ask(c)
        errors.extend(problems)
        limits = (c.get("resources") or {}).get("limits") or {}
        requests = (c.get("resources") or {}).get("requests") or {}
        if ask is not None:
            any_gpu = True
            if not translated:
                errors.append(
                    f"container {c.get('name')!r} asks for {AMOUNT} but the pod was not translated by gpupool's "
                    f"mutating webhook (annotation {ann.INJECT}: {mode.value}); set {ann.INJECT}: all, "
                    f"or ask for {UNITS} units directly"
                )
        for where, values in (("limits", limits), ("requests", requests)):
            if UNITS in values:
                any_gpu = True
                units = parse_units(values[UNITS])
                if units is None or units < 1:
                    errors.append(
                        f"container {c.get('name')!r}: resources.{where}[{UNITS}] {values[UNITS]!r} "
                        f"must be a whole number of units >= 1 (100 = one whole GPU)"
                    )
    try:
        ann.read_filters(annotations)
        ann.read_policy(annotations)
    except InvalidInput as err:
        errors.append(err.message)
    if errors:
        return Verdict(False, "; ".join(errors))
    verdict = Verdict(True, warnings=ann.ignored_warnings(annotations))
    if not any_gpu:
        return verdict
    try:
        claim = pod_claim(pod)
    except InvalidInput as err:
        return Verdict(False, err.message)
    nodes = [list(d) for d in node_devices() if d]
    if claim is not None and nodes:
        problem = _never_fits(claim, nodes)
        if problem:
            return Verdict(False, problem)
    return verdict


def _never_fits(claim: Claim, nodes: Sequence[Sequence[Device]]) -> Optional[str]:
    """Why no node of the cluster could ever hold `claim`, or None when one could."""
    largest = max((d.memory_mib for devs in nodes for d in devs), default=0)
    for request in claim.requests:
        if request.memory_mib is not None and request.memory_mib > largest:
            return (
                f"{USER_KEYS[2]} {format_mib(request.memory_mib)} is more than the largest GPU of the "
                f"cluster ({format_mib(largest)}); ask for at most {format_mib(largest)} per GPU, or use "
                f"{USER_KEYS[1]}"
            )
    if any(place(devs, {}, claim).fits for devs in nodes):
        return None
    most = max(len(devs) for devs in nodes)
    return (
        f"no node of the cluster could ever hold this pod ({claim.describe()}; the biggest node has "
        f"{most} GPU(s) of up to {format_mib(largest)}, {UNITS_PER_GPU} units each); ask for fewer GPUs "
        f"or a smaller share, or split the work across pods"
    )
