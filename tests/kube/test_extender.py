"""Scheduler extender: pure decisions, then the kube-scheduler wire protocol over HTTPS."""

from __future__ import annotations

import json

from gpupool.core.fragmentation import LearnedMix
from gpupool.core.model import Claim, Policy
from gpupool.kube import annotations as ann
from gpupool.kube.extender import NodeState, filter_nodes, handle_prioritize, observe, pod_claim, score_nodes
from gpupool.kube.resources import GpuAsk

from .conftest import gpus


def mutated_pod(asks, policy=None, uid="u1"):
    annotations = {ann.CLAIM: ann.encode_claim(asks), ann.MARKER: "v1"}
    if policy:
        annotations[ann.POLICY] = policy
    return {
        "metadata": {"name": "p", "uid": uid, "annotations": annotations},
        "spec": {
            "containers": [
                {"name": n, "resources": {"limits": {"gpupool.io/gpu": str(a.units(16384))}}} for n, a in asks.items()
            ]
        },
    }


def used(devices, mib_each):
    return {d.uuid: m for d, m in zip(devices, mib_each)}


def test_fragmented_node_is_filtered_out():
    # node-frag: 4 GPUs each 60 % used = 160 units free in total, but no GPU has 50 % free.
    frag = gpus("frag", 4)
    ok = gpus("ok", 2)
    states = {
        "node-frag": NodeState(frag, used(frag, [9831] * 4)),
        "node-ok": NodeState(ok, used(ok, [16384, 0])),
    }
    claim = Claim.single(1, fraction=0.5)
    out = filter_nodes(claim, ["node-frag", "node-ok", "node-unknown"], states)
    assert out.passed == ["node-ok"]
    assert "node-frag" in out.failed and "0 of the node's 4 GPUs have that much free" in out.failed["node-frag"]
    assert "agent" in out.failed["node-unknown"]


def test_n_gpus_each_with_the_fraction():
    devs = gpus("n", 4)
    # Three GPUs have 50 % free, one is full: 2 x 50 % fits, 4 x 50 % does not (but could once freed).
    state = NodeState(devs, used(devs, [8192, 8192, 8192, 16384]))
    assert filter_nodes(Claim.single(2, fraction=0.5), ["n"], {"n": state}).passed == ["n"]
    out = filter_nodes(Claim.single(4, fraction=0.5), ["n"], {"n": state})
    assert out.passed == [] and "n" in out.failed
    never = filter_nodes(Claim.single(5, fraction=0.5), ["n"], {"n": state})
    assert "n" in never.unresolvable


def test_pending_pods_count_before_their_runner_claims():
    devs = gpus("p", 1)
    state = NodeState(devs, {}, frozenset({"running-uid"}))
    half = Claim.single(1, fraction=0.6)
    busy = state.with_pending([("pending-uid", half), ("running-uid", half)])
    assert busy.allocated[devs[0].uuid] == 9830  # the running pod's lease is in the agent's state already
    assert filter_nodes(half, ["p"], {"p": busy}).passed == []


def test_binpack_and_spread_scores():
    a, b = gpus("a", 2), gpus("b", 2)
    states = {"a": NodeState(a, used(a, [8192, 0])), "b": NodeState(b, {})}
    pack = dict(score_nodes(Claim.single(1, fraction=0.25, policy=Policy.BINPACK), ["a", "b"], states))
    spread = dict(score_nodes(Claim.single(1, fraction=0.25, policy=Policy.SPREAD), ["a", "b"], states))
    assert pack["a"] > pack["b"] and spread["b"] > spread["a"]
    assert all(0 <= s <= 10 for s in list(pack.values()) + list(spread.values()))


def test_fragaware_is_the_default_and_ranks_one_node_on_top():
    a, b, c = gpus("a", 2), gpus("b", 2), gpus("c", 1)
    # a: one GPU 60 % used (40 % free); b: one GPU 50 % used; c: full
    states = {
        "a": NodeState(a, used(a, [9831, 0])),
        "b": NodeState(b, used(b, [8192, 0])),
        "c": NodeState(c, used(c, [16384])),
    }
    pod = mutated_pod({"t": GpuAsk(1, percent=50)})
    mix = LearnedMix()
    for _ in range(40):  # the extender has seen many pods asking for 40 %
        observe(mix, Claim.single(1, fraction=0.4), states)
    scores = {h["Host"]: h["Score"] for h in handle_prioritize({"Pod": pod, "NodeNames": list(states)}, states, mix)}
    assert pod_claim(pod).policy is Policy.FRAGAWARE
    # b's half-free GPU takes half a GPU exactly; a would have to break its whole GPU (its
    # 40 %-free one is a hair short), and c cannot hold it
    assert scores["b"] == 10 and 0 < scores["a"] < 10 and scores["c"] == 0


def test_a_pod_without_gpus_goes_where_the_gpus_are_taken():
    idle, busy = gpus("idle", 2), gpus("busy", 2)
    states = {"idle": NodeState(idle, {}), "busy": NodeState(busy, used(busy, [16384, 12000]))}
    web = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "web"}]}}
    scores = {
        h["Host"]: h["Score"] for h in handle_prioritize({"Pod": web, "NodeNames": ["idle", "busy", "cpu"]}, states)
    }
    assert scores["cpu"] == 10 and scores["busy"] > scores["idle"] >= 1


def test_pod_claim_from_annotation_units_or_user_resources():
    pod = mutated_pod({"a": GpuAsk(2, percent=30), "b": GpuAsk(1, memory_mib=4096)}, policy="spread")
    claim = pod_claim(pod)
    assert [r.count for r in claim.requests] == [2, 1] and claim.policy is Policy.SPREAD
    bare = {"spec": {"containers": [{"name": "x", "resources": {"limits": {"gpupool.io/gpu": "200"}}}]}}
    assert pod_claim(bare).requests[0].count == 2
    assert pod_claim({"spec": {"containers": [{"name": "web"}]}}) is None


def test_extender_over_https_node_names_and_node_list(client, cluster):
    pod = mutated_pod({"train": GpuAsk(3, percent=50)})
    # Wire format of k8s.io/kube-scheduler/extender/v1 (Go field names, no json tags).
    status, body = client.post("/extender/filter", {"Pod": pod, "NodeNames": ["node-a", "node-b", "node-x"]})
    assert status == 200 and body["Error"] == ""
    assert body["NodeNames"] == ["node-b"]
    assert set(body["FailedAndUnresolvableNodes"]) == {"node-a"}  # 2 GPUs can never hold 3
    assert set(body["FailedNodes"]) == {"node-x"}
    nodes = {"apiVersion": "v1", "kind": "NodeList", "items": [{"metadata": {"name": n}} for n in ("node-a", "node-b")]}
    status, body = client.post("/extender/filter", {"pod": pod, "nodes": nodes})
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["node-b"]
    status, body = client.post("/extender/prioritize", {"Pod": pod, "NodeNames": ["node-a", "node-b"]})
    assert status == 200 and {h["Host"] for h in body} == {"node-a", "node-b"}
    assert all(isinstance(h["Score"], int) for h in body)
    # A pod without GPUs passes everywhere; a broken one gets Error, not an HTTP failure.
    status, body = client.post(
        "/extender/filter", {"Pod": {"spec": {"containers": [{"name": "w"}]}}, "NodeNames": ["node-a"]}
    )
    assert body["NodeNames"] == ["node-a"]
    bad = {
        "metadata": {"annotations": {ann.POLICY: "nope"}},
        "spec": {"containers": [{"name": "w", "resources": {"limits": {"gpupool.io/gpu": "5"}}}]},
    }
    status, body = client.post("/extender/filter", {"Pod": bad, "NodeNames": ["node-a"]})
    assert status == 200 and "policy" in body["Error"]
    json.dumps(body)
