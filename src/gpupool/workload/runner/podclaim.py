"""Inside a pod: the claim the runner sends, as it was decided before the container started.

$GPUPOOL_CLAIM holds the container's claim (`Claim.to_dict` JSON), set by the mutating webhook:
the claim the extender's bind recorded for the container (`gpupool.io/choice.N`, each GPU pinned
by `device.uuid`), or, where the scheduler does not bind through the extender, the container's
ask. $GPUPOOL_ALLOCATED_GPUS (the device plugin's Allocate) names the GPUs the kubelet counted the
container's units on: an unpinned claim is pinned to them, a pinned one is checked against them.
Either way the node's pool admits the share where it was decided; it does not choose again.
"""

from __future__ import annotations

import glob
import json
from dataclasses import replace
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput
from ...core.model import Claim, GpuRequest
from ...pooling.isolation.env import ALLOCATED_GPUS_ENV, CLAIM_ENV

if TYPE_CHECKING:
    from typing import Callable, List, Mapping, Optional

UUID_KEY = "device.uuid"


def decided_claim(environ: Mapping[str, str], say: Callable[[str], None]) -> Optional[Claim]:
    """The claim of $GPUPOOL_CLAIM, following $GPUPOOL_ALLOCATED_GPUS; None when the variable is unset.

    Raises InvalidInput (one line, naming the variable and the fix) when it is empty or unreadable.
    """
    text = environ.get(CLAIM_ENV)
    if text is None:
        return None
    if not text.strip():
        raise InvalidInput(
            f"${CLAIM_ENV} is empty: the pod was not bound by gpupool's scheduler extender, which records each "
            "GPU container's claim (annotation gpupool.io/choice.N); run kube-scheduler with the configuration "
            "of `gpupool kube scheduler-config`, or, where the scheduler cannot call the extender, the webhook "
            "with --no-bind"
        )
    try:
        data = json.loads(text)
    except ValueError:
        raise InvalidInput(
            f"${CLAIM_ENV} {text[:80]!r} is not JSON: it is the claim gpupool's webhook gives the container; "
            f"unset it, or give the share with -n/-p/-m"
        ) from None
    return follow_allocation(Claim.from_dict(data), environ.get(ALLOCATED_GPUS_ENV, ""), say)


def follow_allocation(claim: Claim, allocated_text: str, say: Callable[[str], None]) -> Claim:
    """`claim` on the GPUs of `allocated_text` (comma-separated UUIDs): pinned there when it names
    no GPU and asks for that many; checked (a warning when they differ) when it is pinned already."""
    allocated = [u for u in allocated_text.split(",") if u]
    if not allocated:
        return claim
    pinned = pinned_gpus(claim)
    if pinned is not None:
        if sorted(pinned) != sorted(glob.escape(u) for u in allocated):
            say(
                f"warning: the kubelet counts this container's units on {', '.join(allocated)}; "
                f"its claim is pinned to {', '.join(pinned)} (the extender's choice), claimed there"
            )
        return claim
    asked = sum(r.count for r in claim.requests)
    if asked != len(allocated):
        say(
            f"warning: the device plugin allocated units on {len(allocated)} GPU(s) for a claim of {asked}: "
            "the node's pool chooses the GPUs"
        )
        return claim
    from ...core.filters import Filter  # only here: a run without filters never loads core.filters

    gpus = iter(allocated)
    requests: List[GpuRequest] = []
    for r in claim.requests:
        for _ in range(r.count):
            pin = Filter(UUID_KEY, "=", glob.escape(next(gpus)))
            requests.append(GpuRequest(1, r.fraction, r.memory_mib, (*r.filters, pin)))
    return replace(claim, requests=tuple(requests))


def pinned_gpus(claim: Claim) -> Optional[List[str]]:
    """The `device.uuid` value of each request when every request is one GPU pinned that way, else None."""
    out: List[str] = []
    for r in claim.requests:
        pins = [f.value for f in r.filters if f.key == UUID_KEY and f.op == "="]
        if r.count != 1 or len(pins) != 1:
            return None
        out += pins
    return out
