"""Scheduling for real: kube-scheduler filters, ranks and binds GPU pods through gpupool's extender
(the configuration `gpupool kube scheduler-config` writes), kwok runs them, and the node agents'
pools then grant exactly what the bind recorded; a pod that fits nowhere waits with the extender's
reason and binds once deleting pods frees room; a deleted pod's lease is released by its node's
agent, which reads the pods of its node from the API server.

Each assertion reads something only the extender writes or says (`gpupool.io/choice`, bound by
the extender; "gpupool:" reasons in FailedScheduling): with the extender bypassed (a scheduler
configuration without it), every test here fails."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

import pytest
from waiting import wait_until

from gpupool.core.model import Claim, Holder
from gpupool.workload.client.http import HttpPoolClient

from .cluster_fixture import GPUS, NODES, gpu_pod

pytestmark = pytest.mark.cluster

GPU_MIB = 80 * 1024  # gpupool_side.GPU_MEMORY
CHOICE = "gpupool.io/choice"
# 24 pods of mixed shares on 4 nodes x 8 GPUs: (count, limits)
MIX: List[Tuple[int, Dict[str, str]]] = [
    (8, {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "30"}),
    (6, {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "50"}),
    (4, {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "70"}),
    (2, {"gpupool.io/gpu-amount": "2", "gpupool.io/gpu-percent": "40"}),
    (2, {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-memory": "20Gi"}),
    (2, {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "100"}),
]


class ChoiceWatch:
    """Every value of `gpupool.io/choice` each pod of a namespace had, from a watch of the API."""

    def __init__(self, cluster: Any, ns: str) -> None:
        from kubernetes import watch

        self.seen: Dict[str, List[str]] = defaultdict(list)
        self.error: Optional[BaseException] = None
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(cluster, ns), daemon=True)
        self._thread.start()

    def _run(self, cluster: Any, ns: str) -> None:
        try:
            for event in self._watch.stream(cluster.core.list_namespaced_pod, ns, timeout_seconds=600):
                pod = event["object"]
                value = (pod.metadata.annotations or {}).get(CHOICE)
                values = self.seen[pod.metadata.name]
                if value and (not values or values[-1] != value):
                    values.append(value)
        except Exception as err:  # the API server going at the end of the session cuts the stream
            self.error = err

    def stop(self) -> None:
        self._watch.stop()


def share_mib(annotations: Dict[str, str], container: str) -> int:
    """MiB the container's ask takes on each of its GPUs (the webhook's record of the ask)."""
    ask = json.loads(annotations["gpupool.io/claim"])[container]
    return ask["memory_mib"] if ask["memory_mib"] else GPU_MIB * ask["percent"] // 100


def used_by_gpu(pods: List[Dict[str, Any]]) -> Dict[Tuple[str, str], int]:
    """MiB held on each (node, GPU) by the recorded choices of `pods`."""
    used: Dict[Tuple[str, str], int] = defaultdict(int)
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        choice = json.loads(annotations[CHOICE])
        for container, uuids in choice["gpus"].items():
            for uuid in uuids:
                used[(choice["node"], uuid)] += share_mib(annotations, container)
    return used


def node_index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


@pytest.fixture(scope="module")
def placed(cluster):
    """The 24 pods, created at once, each bound and Running; the watch of their choices."""
    ns = cluster.namespace("sched")
    watch = ChoiceWatch(cluster, ns)
    names = []
    for count, limits in MIX:
        for _ in range(count):
            name = f"p{len(names):02d}"
            cluster.create_pod(ns, gpu_pod(name, limits, {"gpupool.io/policy": "binpack"}))
            names.append(name)

    def all_running():
        pods = cluster.pods(ns)
        return pods if len(pods) == len(names) and all(p["status"].get("phase") == "Running" for p in pods) else None

    pods = wait_until(all_running, 300, "the 24 pods to be bound and Running", interval=1)
    yield ns, pods, watch
    watch.stop()


def test_every_gpu_pod_is_bound_by_the_extender_on_the_gpus_it_recorded(cluster, placed):
    ns, pods, _ = placed
    assert len(pods) == sum(count for count, _ in MIX)
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        choice = json.loads(annotations[CHOICE])  # only the extender's bind writes it
        assert choice["node"] == pod["spec"]["nodeName"]
        ask = json.loads(annotations["gpupool.io/claim"])["train"]
        assert len(set(choice["gpus"]["train"])) == ask["amount"]
        runner = json.loads(annotations["gpupool.io/choice.0"])  # what the container's runner sends
        assert [r["filters"] for r in runner["requests"]] == [[f"device.uuid={u}"] for u in choice["gpus"]["train"]]
    # The pods went where kube-scheduler asked the extender: its calls were counted there.
    assert cluster.webhook_calls("filter") >= 1 and cluster.webhook_calls("bind") >= len(pods)


def test_no_gpu_is_given_more_than_it_has(cluster, placed):
    _, pods, _ = placed
    assert all(CHOICE in p["metadata"]["annotations"] for p in pods)  # not vacuous: every GPU is counted
    used = used_by_gpu(gpu_pods_everywhere(cluster))  # with the other tests' GPU pods
    over = {gpu: mib for gpu, mib in used.items() if mib > GPU_MIB}
    assert not over, f"GPUs given more than {GPU_MIB} MiB: {over}"
    assert {node for node, _ in used} <= {f"gpu-node-{i}" for i in range(NODES)}
    assert all(len({u for n, u in used if n == node}) <= GPUS for node, _ in used)


def test_each_choice_is_written_once(placed):
    ns, pods, watch = placed
    wait_until(lambda: len(watch.seen) == len(pods) or watch.error, 60, "the watch to see every pod's choice")
    assert watch.error is None
    assert {name: len(values) for name, values in watch.seen.items()} == {p["metadata"]["name"]: 1 for p in pods}


def test_the_node_pools_grant_the_recorded_gpus_and_release_a_deleted_pods_lease(cluster, placed):
    """Each pod's runner claims `gpupool.io/choice.0` from its node's agent (done here, as the
    runner in the container would): the pool grants every one, on the recorded GPUs."""
    ns, pods, _ = placed
    side = cluster.side
    token = side.agent_token_file.read_text().strip()
    ca = str(side.tls / "agent-ca.crt")
    granted: Dict[str, Any] = {}
    for pod in pods:
        meta = pod["metadata"]
        agent = HttpPoolClient(side.agent_url(node_index(pod["spec"]["nodeName"])), token, ca)
        try:
            claim = Claim.from_dict(json.loads(meta["annotations"]["gpupool.io/choice.0"]))
            label = f"pod:{ns}/{meta['name']}:{meta['uid']}"
            granted[meta["name"]] = agent.claim(claim, Holder("team", 0, "", label), ttl_s=3600)
        finally:
            agent.close()
    for pod in pods:
        choice = json.loads(pod["metadata"]["annotations"][CHOICE])
        lease = granted[pod["metadata"]["name"]]
        assert sorted(s.device_uuid for s in lease.slices) == sorted(choice["gpus"]["train"])
    # A pod deleted mid-run: its node's agent sees it gone from the API server and releases its lease.
    victim = pods[0]
    node = node_index(victim["spec"]["nodeName"])
    cluster.core.delete_namespaced_pod(victim["metadata"]["name"], ns, grace_period_seconds=0)

    def leases_on_node():
        agent = HttpPoolClient(side.agent_url(node), token, ca)
        try:
            return {lease.id for lease in agent.status().leases}
        finally:
            agent.close()

    gone = granted[victim["metadata"]["name"]].id
    wait_until(lambda: gone not in leases_on_node(), 60, "the agent to release the deleted pod's lease")
    # The other pods of that node keep theirs (they still exist).
    kept = {granted[p["metadata"]["name"]].id for p in pods[1:] if node_index(p["spec"]["nodeName"]) == node}
    assert leases_on_node() == kept


def gpu_pods_everywhere(cluster) -> List[Dict[str, Any]]:
    """Every pod of the cluster holding a recorded choice and not ended (other tests' too)."""
    found = cluster.json(cluster.core.list_pod_for_all_namespaces())["items"]
    return [
        p
        for p in found
        if CHOICE in (p["metadata"].get("annotations") or {})
        and p["status"].get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    ]


def test_a_pod_that_fits_nowhere_waits_with_the_extenders_reason_then_binds_when_room_frees(cluster, placed):
    ns, _, _ = placed
    # Make every GPU partly used (spread: the emptiest GPUs first), so that no GPU has 100 % free
    # while every node still has units to spare: kube-scheduler's own filter passes, the extender's does not.
    fillers = []
    for node in range(NODES):
        busy = {u for (n, u) in used_by_gpu(gpu_pods_everywhere(cluster)) if n == f"gpu-node-{node}"}
        empty = GPUS - len(busy)
        if empty:
            name = f"filler-{node}"
            limits = {"gpupool.io/gpu-amount": str(empty), "gpupool.io/gpu-percent": "5"}
            pod = gpu_pod(name, limits, {"gpupool.io/policy": "spread"})
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": f"gpu-node-{node}"}
            cluster.create_pod(ns, pod)
            fillers.append(name)
    wait_until(lambda: all(cluster.pod(ns, f)["spec"].get("nodeName") for f in fillers), 120, "the fillers to be bound")
    everything = gpu_pods_everywhere(cluster)
    assert len(used_by_gpu(everything)) == NODES * GPUS  # every GPU partly used
    cluster.create_pod(ns, gpu_pod("whole", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "100"}))

    def failed_scheduling():
        return [e for e in cluster.events(ns, "whole") if e["reason"] == "FailedScheduling"]

    events = wait_until(failed_scheduling, 120, "a FailedScheduling event for the pod that fits nowhere")
    message = events[-1]["message"]
    assert "gpupool: needs 1 GPU" in message, message  # the extender's reason, through kube-scheduler
    assert not cluster.pod(ns, "whole")["spec"].get("nodeName")
    # Free one GPU: delete every pod on it; the waiting pod binds there.
    node, uuid = next(iter(used_by_gpu([p for p in everything if p["metadata"]["name"] in fillers])))
    for pod in everything:
        choice = json.loads(pod["metadata"]["annotations"][CHOICE])
        if choice["node"] == node and any(uuid in uuids for uuids in choice["gpus"].values()):
            meta = pod["metadata"]
            cluster.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0)
    pod = wait_until(
        lambda: (p := cluster.pod(ns, "whole"))["spec"].get("nodeName") and p, 120, "the waiting pod to bind"
    )
    choice = json.loads(pod["metadata"]["annotations"][CHOICE])
    assert (choice["node"], choice["gpus"]["train"]) == (node, [uuid])
