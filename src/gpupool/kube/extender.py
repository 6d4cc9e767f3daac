"""Scheduler extender decisions (kube-scheduler extender API v1), pure functions over node state.

A node passes the filter only if its GPUs can hold the pod's exact claim:
N distinct GPUs each with the fraction free, not just enough units in total.
Scores follow the pod's `gpupool.io/policy`: fragaware (the default) ranks nodes by
how little the placement grows their expected fragmentation against the claims the
extender has seen (core/fragmentation), the best node alone at the top score; binpack
prefers full nodes, spread empty ones. Wire shapes follow k8s.io/kube-scheduler/extender/v1,
whose Go structs carry no json tags (keys are "Pod", "NodeNames", ...); Go
decodes keys case-insensitively, and so does `_get` here.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import InvalidInput
from ..core.fragmentation import Fragmentation, LearnedMix, NodeFree, TaskShape, node_free, request_shape
from ..core.model import Claim, Device, GpuRequest, Policy, pod_uid_of_label
from ..core.nodescore import fragaware_evaluate, rank_scores
from ..core.placement import NO_HISTORY, place
from . import annotations as ann
from .resources import UNITS, GpuAsk, claim_of, parse_units, read_ask

MAX_SCORE = 10  # extenderv1.MaxExtenderPriority


@dataclass(frozen=True)
class NodeState:
    """What a node agent reports: its devices, the MiB held on each, and the pod UIDs holding leases."""

    devices: Tuple[Device, ...]
    allocated: Mapping[str, int]
    holders: FrozenSet[str] = frozenset()  # pod UIDs with a live lease on this node

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> NodeState:
        """From the agent's GET /v1/status body (PoolStatus.to_dict())."""
        devices = tuple(Device.from_dict(d) for d in status.get("devices", []))
        allocated = {d["uuid"]: int(d.get("allocated_mib", 0)) for d in status.get("devices", [])}
        uids = set()
        for lease in status.get("leases", []):
            uid = pod_uid_of_label(((lease.get("holder") or {}).get("label")) or "")
            if uid:
                uids.add(uid)
        return cls(devices, allocated, frozenset(uids))

    @cached_property
    def free_by_size(self) -> Dict[int, List[int]]:
        """Free MiB of the healthy GPUs, ascending, per GPU memory size: the filter's fast path
        counts the GPUs with enough free with one bisect per size instead of a loop over GPUs.
        Computed once per state (states are replaced, never changed, when agents report)."""
        out: Dict[int, List[int]] = {}
        allocated = self.allocated
        for d in self.devices:
            if d.healthy:
                out.setdefault(d.memory_mib, []).append(d.memory_mib - allocated.get(d.uuid, 0))
        for frees in out.values():
            frees.sort()
        return out

    @cached_property
    def first_healthy(self) -> Optional[Device]:
        return next((d for d in self.devices if d.healthy), None)

    @cached_property
    def scores(self) -> Dict[Tuple[int, int, int], Optional[float]]:
        """fragaware's score of this state per (mix, GPUs, share), filled as pods ask (states are never changed)."""
        return {}

    @cached_property
    def free(self) -> NodeFree:
        """The healthy GPUs' free share (thousandths), what fragaware scores; computed once per state."""
        return node_free(self.devices, {d.uuid: d.memory_mib - self.allocated.get(d.uuid, 0) for d in self.devices})

    def with_pending(self, pending: Iterable[Tuple[str, Claim]]) -> NodeState:
        """Count pods bound here whose runner has not claimed yet, so two pods are not promised one slice."""
        allocated = dict(self.allocated)
        for uid, claim in pending:
            if uid in self.holders:
                continue
            placed = place(self.devices, allocated, claim)
            for s in placed.slices or ():
                allocated[s.device_uuid] = allocated.get(s.device_uuid, 0) + s.memory_mib
        return NodeState(self.devices, allocated, self.holders)


def pod_claim(pod: Mapping[str, Any]) -> Optional[Claim]:
    """The pod's claim: one request per GPU container; None when the pod asks for no GPU.

    Reads the webhook's `gpupool.io/claim` annotation; without it, the user's
    resources, else the bare units (one GPU's share, or whole GPUs).
    """
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    asks: List[GpuAsk] = []
    recorded = ann.decode_claim(annotations.get(ann.CLAIM))
    if recorded is not None:
        asks = list(recorded.values())
    else:
        for c in containers:
            ask, errors = read_ask(c)
            if errors:
                raise InvalidInput("; ".join(errors))
            if ask is None:
                limits = (c.get("resources") or {}).get("limits") or (c.get("resources") or {}).get("requests") or {}
                units = parse_units(limits[UNITS]) if UNITS in limits else None
                ask = GpuAsk.from_units(units) if units else None
            if ask is not None:
                asks.append(ask)
    if not asks:
        return None
    return claim_of(asks, ann.read_filters(annotations), ann.read_policy(annotations))


@dataclass
class FilterOutcome:
    passed: List[str] = field(default_factory=list)
    failed: Dict[str, str] = field(default_factory=dict)  # may fit later (leases end)
    unresolvable: Dict[str, str] = field(default_factory=dict)  # never, whatever is preempted


def filter_nodes(claim: Optional[Claim], names: Sequence[str], states: Mapping[str, NodeState]) -> FilterOutcome:
    """Which of `names` can hold `claim` now."""
    out = FilterOutcome()
    if claim is None:
        out.passed = list(names)
        return out
    quick = len(claim.requests) == 1 and not claim.requests[0].filters
    need_by_size: Dict[int, int] = {}
    for name in names:
        state = states.get(name)
        if state is None:
            out.failed[name] = "no GPU state from the gpupool agent on this node (not installed or not answering)"
            continue
        if quick:
            _quick_filter(name, state, claim.requests[0], out, need_by_size)
            continue
        placement = place(state.devices, state.allocated, claim)
        if placement.fits:
            out.passed.append(name)
            continue
        never = place(state.devices, {}, claim)
        target = out.failed if never.fits else out.unresolvable
        target[name] = "gpupool: " + placement.reason
    return out


def _quick_filter(
    name: str, state: NodeState, request: GpuRequest, out: FilterOutcome, need_by_size: Dict[int, int]
) -> None:
    """One request without filters: count GPUs with the share free (what `place` decides, without its sorting).

    The common case, and 1,000 nodes must be judged well inside the scheduler's timeout.
    """
    fitting = possible = 0
    for size, frees in state.free_by_size.items():
        need = need_by_size.get(size)
        if need is None:
            need = need_by_size[size] = _need(request, size)
        if need <= size:
            possible += len(frees)
            fitting += len(frees) - bisect.bisect_left(frees, need)
    if fitting >= request.count:
        out.passed.append(name)
        return
    target = out.failed if possible >= request.count else out.unresolvable
    target[name] = (
        f"gpupool: needs {request.describe()}; {fitting} of the node's {len(state.devices)} GPUs have that much free"
    )


def _need(request: GpuRequest, memory_mib: int) -> int:
    """MiB `request` takes on a GPU of `memory_mib` (GpuRequest.memory_on, by size alone)."""
    return request.memory_on(Device("", 0, "", memory_mib))


def score_nodes(
    claim: Optional[Claim],
    names: Sequence[str],
    states: Mapping[str, NodeState],
    frag: Optional[Fragmentation] = None,
) -> List[Tuple[str, int]]:
    """0..10 per node: fragaware's rank, or how full (binpack) or how empty (spread) its GPUs are after placing `claim`."""
    if claim is None:
        # A pod without GPUs (sent here when the scheduler config asks the extender about every
        # pod): it belongs where the GPUs are taken, so it does not eat a GPU task's CPUs. Nodes
        # without a gpupool agent have no GPUs to strand.
        return list(zip(names, rank_scores([-states[n].free.free_milli if n in states else 0.0 for n in names])))
    if claim.policy is Policy.FRAGAWARE:
        return list(zip(names, rank_scores(fragaware_scores(claim, names, states, frag or NO_HISTORY))))
    scores = []
    for name in names:
        state = states.get(name)
        placement = place(state.devices, state.allocated, claim) if state else None
        if state is None or not placement or not placement.fits:
            scores.append((name, 0))
            continue
        total = sum(d.memory_mib for d in state.devices if d.healthy) or 1
        used = sum(state.allocated.get(d.uuid, 0) for d in state.devices if d.healthy)
        used += sum(s.memory_mib for s in placement.slices or ())
        full = min(1.0, used / total)
        share = full if claim.policy is Policy.BINPACK else 1.0 - full
        scores.append((name, int(math.floor(share * MAX_SCORE + 1e-9))))
    return scores


def fragaware_scores(
    claim: Claim, names: Sequence[str], states: Mapping[str, NodeState], frag: Fragmentation
) -> List[Optional[float]]:
    """Minus the growth of each node's expected fragmentation when it takes `claim` (None: it cannot).

    One request without filters (the common case) is scored on the node's cached free
    shares, and the score is kept on the node's state for the next pod of that shape; a gang
    or filtered claim goes through `place` first.
    """
    out: List[Optional[float]] = []
    quick = len(claim.requests) == 1 and not claim.requests[0].filters
    shapes: Dict[int, TaskShape] = {}
    for name in names:
        state = states.get(name)
        if state is None:
            out.append(None)
            continue
        healthy = state.first_healthy
        if quick and healthy is not None:
            shape = shapes.get(healthy.memory_mib)
            if shape is None:
                shape = shapes[healthy.memory_mib] = request_shape(claim.requests[0], healthy)
            cache = state.scores
            key = (frag.serial, shape.gpus, shape.milli)
            if key in cache:
                score = cache[key]
            else:
                evaluation = fragaware_evaluate(state.free, shape, frag)
                score = cache[key] = None if evaluation is None else evaluation.score
            if score is not None:
                out.append(score)
                continue
        placement = place(state.devices, state.allocated, claim, frag)
        if placement.slices is None:
            out.append(None)
            continue
        after = dict(state.allocated)
        for s in placement.slices:
            after[s.device_uuid] = after.get(s.device_uuid, 0) + s.memory_mib
        after_free = node_free(state.devices, {d.uuid: d.memory_mib - after.get(d.uuid, 0) for d in state.devices})
        out.append(frag.of(state.free) - frag.of(after_free))
    return out


def observe(mix: LearnedMix, claim: Claim, states: Mapping[str, NodeState]) -> None:
    """Count a pod's claim in the extender's mix (its share of a GPU like the cluster's first one)."""
    device = next((d for s in states.values() for d in s.devices if d.healthy), None)
    if device is None:
        return
    for request in claim.requests:
        mix.observe(request_shape(request, device))


def message_field(obj: Mapping[str, Any], key: str) -> Any:
    """A field of an extender message, matching keys case-insensitively as Go does."""
    if key in obj:
        return obj[key]
    lowered = key.lower()
    for k, v in obj.items():
        if k.lower() == lowered:
            return v
    return None


def _candidates(args: Mapping[str, Any]) -> Tuple[List[str], Optional[List[Dict[str, Any]]]]:
    names = message_field(args, "NodeNames")
    nodes = message_field(args, "Nodes")
    items = (nodes or {}).get("items") if isinstance(nodes, dict) else None
    if names is None and items is not None:
        names = [((n.get("metadata") or {}).get("name")) for n in items]
    return [str(n) for n in names or []], items


def handle_filter(args: Mapping[str, Any], states: Mapping[str, NodeState]) -> Dict[str, Any]:
    """ExtenderArgs -> ExtenderFilterResult (errors go in "Error", as the protocol expects)."""
    names, items = _candidates(args)
    try:
        claim = pod_claim(message_field(args, "Pod") or {})
    except InvalidInput as err:
        return {"NodeNames": None, "FailedNodes": {}, "Error": err.message}
    outcome = filter_nodes(claim, names, states)
    result: Dict[str, Any] = {
        "FailedNodes": outcome.failed,
        "FailedAndUnresolvableNodes": outcome.unresolvable,
        "Error": "",
    }
    if items is not None and message_field(args, "NodeNames") is None:
        keep = set(outcome.passed)
        result["Nodes"] = {
            "apiVersion": "v1",
            "kind": "NodeList",
            "metadata": {},
            "items": [n for n in items if (n.get("metadata") or {}).get("name") in keep],
        }
    else:
        result["NodeNames"] = outcome.passed
    return result


def handle_prioritize(
    args: Mapping[str, Any], states: Mapping[str, NodeState], mix: Optional[LearnedMix] = None
) -> List[Dict[str, Any]]:
    """ExtenderArgs -> HostPriorityList; `mix` (the server's LearnedMix) learns each pod's claim."""
    names, _ = _candidates(args)
    try:
        claim = pod_claim(message_field(args, "Pod") or {})
    except InvalidInput:
        claim = None
    if mix is not None and claim is not None:
        observe(mix, claim, states)
    frag = mix.frag if mix is not None else None
    return [{"Host": n, "Score": s} for n, s in score_nodes(claim, names, states, frag)]
