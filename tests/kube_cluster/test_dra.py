"""DRA for real: each node agent (`--dra`) publishes its node's GPUs as a ResourceSlice to the real
API server, as its own service account; the real kube-scheduler allocates ResourceClaims from them
(a whole GPU; half a GPU's memory, two halves sharing one GPU through consumable capacity) and a
claim that fits nowhere stays unallocated, its pod Pending with the scheduler's reason."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
from waiting import wait_until

from .cluster_fixture import GPUS, NODES

pytestmark = pytest.mark.cluster

DRIVER = "gpu.gpupool.io"  # kube.dra.DEFAULT_DRIVER, the DeviceClass of deploy/dra
GROUP, VERSION = "resource.k8s.io", "v1"


def gib(quantity: str) -> float:
    from kubernetes.utils import parse_quantity

    return float(parse_quantity(quantity)) / 2**30


def custom(cluster: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(cluster.api)


def slices(cluster: Any) -> List[Dict[str, Any]]:
    found = custom(cluster).list_cluster_custom_object(GROUP, VERSION, "resourceslices")
    return [s for s in found.get("items") or [] if s["spec"]["driver"] == DRIVER]


def claim(name: str, memory: str = "") -> Dict[str, Any]:
    """A ResourceClaim for one GPU of gpupool's DeviceClass, or `memory` of one."""
    exactly: Dict[str, Any] = {"deviceClassName": DRIVER}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod_with_claim(name: str, claim_name: str, node: str = "") -> Dict[str, Any]:
    pod: Dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [{"name": "train", "image": "python:3.11", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    if node:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


def allocation(cluster: Any, ns: str, name: str) -> Any:
    got = custom(cluster).get_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims", name)
    return (got.get("status") or {}).get("allocation")


def test_each_node_agent_publishes_its_gpus_as_a_resource_slice(cluster):
    found = wait_until(lambda: s if len(s := slices(cluster)) == NODES else None, 120, "a ResourceSlice per node")
    assert sorted(s["spec"]["nodeName"] for s in found) == [f"gpu-node-{i}" for i in range(NODES)]
    for one in found:
        devices = one["spec"]["devices"]
        assert len(devices) == GPUS
        assert {gib(d["capacity"]["memory"]["value"]) for d in devices} == {80}
        assert all(d["allowMultipleAllocations"] for d in devices)


def test_the_scheduler_allocates_whole_and_half_gpus_from_the_slices(cluster):
    ns = cluster.namespace("dra")
    wait_until(lambda: len(slices(cluster)) == NODES, 120, "a ResourceSlice per node")
    api = custom(cluster)
    node = "gpu-node-3"
    # One at a time: each allocation is in the API server before the next claim is scheduled. Claims
    # scheduled together see each other's allocations still in flight, and the scheduler may then
    # keep a device with an in-flight share out of the next claim's choice (a CI run put the two
    # halves on two GPUs so).
    for name, memory in (("whole", ""), ("half-a", "38Gi"), ("half-b", "38Gi")):
        api.create_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims", claim(name, memory))
        cluster.create_pod(ns, pod_with_claim(f"pod-{name}", name, node))
        wait_until(lambda name=name: allocation(cluster, ns, name), 120, f"the scheduler to allocate claim {name}")
        wait_until(
            lambda name=name: cluster.pod(ns, f"pod-{name}")["spec"].get("nodeName") == node, 60, "the pod bound"
        )
    results = {n: allocation(cluster, ns, n)["devices"]["results"] for n in ("whole", "half-a", "half-b")}
    for got in results.values():
        assert [(r["driver"], r["pool"]) for r in got] == [(DRIVER, node)]
    whole, half_a, half_b = (results[n][0] for n in ("whole", "half-a", "half-b"))
    # A claim naming no memory consumes the whole GPU: no half shares it.
    assert whole["device"] not in (half_a["device"], half_b["device"])
    assert gib(whole["consumedCapacity"]["memory"]) == 80
    assert gib(half_a["consumedCapacity"]["memory"]) == gib(half_b["consumedCapacity"]["memory"]) == 38
    # Two halves on one GPU (consumable capacity), told apart by their share IDs.
    assert half_a["device"] == half_b["device"]
    assert half_a["shareID"] != half_b["shareID"]


def test_a_claim_that_fits_nowhere_stays_unallocated_with_the_schedulers_reason(cluster):
    ns = cluster.namespace("dra")
    custom(cluster).create_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims", claim("huge", "100Gi"))
    cluster.create_pod(ns, pod_with_claim("pod-huge", "huge"))

    def failed_scheduling():
        return [e for e in cluster.events(ns, "pod-huge") if e["reason"] == "FailedScheduling"]

    events = wait_until(failed_scheduling, 120, "a FailedScheduling event for the claim that fits nowhere")
    assert "cannot allocate all claims" in events[-1]["message"], events[-1]["message"]
    assert allocation(cluster, ns, "huge") is None
    assert not cluster.pod(ns, "pod-huge")["spec"].get("nodeName")
