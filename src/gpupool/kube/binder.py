"""The scheduler extender's bind verb: the pod's share decided once, recorded, then the pod bound.

kube-scheduler hands binding to an extender configured with `bindVerb` (ExtenderBindingArgs:
PodName, PodNamespace, PodUID, Node). The extender reads the pod, places its claim on that
node (kube.choice.choose: core placement with the extender's learned mix), writes the choice to
the pod's `gpupool.io/choice` annotation (and each GPU container's pinned claim, `choice.N`, for
its runner), and creates the pod's Binding, as the scheduler's own binder would. Errors go back
in ExtenderBindingResult.Error; the scheduler then retries the pod.
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any, Callable, Dict, Mapping, Optional

from ..core.errors import GpupoolError
from ..core.fragmentation import Fragmentation
from ..core.model import Claim
from . import annotations as ann
from .apiclient import ApiError, KubeApi
from .choice import choose, pinned_claim, runner_claims
from .extender import NodeState, message_field

log = logging.getLogger(__name__)


Bound = Callable[[str, str, Claim], None]
"""Told of each pod bound with a choice: (node, pod UID, its claim pinned to the chosen GPUs)."""


def handle_bind(
    args: Mapping[str, Any],
    states: Mapping[str, NodeState],
    api: KubeApi,
    frag: Optional[Fragmentation] = None,
    bound: Optional[Bound] = None,
) -> Dict[str, Any]:
    """ExtenderBindingArgs -> ExtenderBindingResult ({"Error": ""} once the pod is bound); `bound`
    is told of the pod and its pinned claim, so that the next bind counts it (ClusterState.assume)."""
    name, namespace, uid, node = (
        str(message_field(args, k) or "") for k in ("PodName", "PodNamespace", "PodUID", "Node")
    )
    if not (name and namespace and node):
        return {"Error": "gpupool extender: bind needs PodName, PodNamespace and Node (ExtenderBindingArgs)"}
    where = f"/api/v1/namespaces/{_segment(namespace)}/pods/{_segment(name)}"
    try:
        pod = api.request("GET", where)
        if uid and (pod.get("metadata") or {}).get("uid") != uid:
            return {"Error": f"gpupool extender: pod {namespace}/{name} is no longer the one of UID {uid}"}
        state = states.get(node)
        choice = None
        if state is not None:
            choice = choose(pod, node, state.devices, state.allocated, frag)
        elif ann.CLAIM in ((pod.get("metadata") or {}).get("annotations") or {}):
            return {"Error": f"gpupool extender: no GPU state of node {node} (its gpupool agent is not answering)"}
        if choice is not None:
            written = {ann.CHOICE: choice.encode(), **runner_claims(choice, pod)}
            patch = {"metadata": {"annotations": written}}
            api.request("PATCH", where, patch, content_type="application/merge-patch+json")
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        api.request("POST", where + "/binding", binding)
    except ApiError as err:
        return {"Error": f"gpupool extender: {err}"}
    except GpupoolError as err:  # the node cannot hold it now, or a pod that skipped the webhook
        return {"Error": f"gpupool extender: pod {namespace}/{name}: {err.message}"}
    if choice is not None:
        log.info("bound %s/%s to %s on GPUs %s", namespace, name, node, choice.encode())
        annotations = {**((pod.get("metadata") or {}).get("annotations") or {}), **written}
        claim = pinned_claim({"metadata": {"annotations": annotations}})
        if bound is not None and claim is not None:
            bound(node, str((pod.get("metadata") or {}).get("uid") or uid), claim)
    return {"Error": ""}


def _segment(text: str) -> str:
    """One path segment of an API URL (names are DNS labels; a hostile one must not add a segment)."""
    return urllib.parse.quote(text, safe="")
