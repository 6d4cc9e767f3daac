"""Kueue for real: its controller (the pinned release, built from its Go module) runs against the
local control plane with deploy/examples/kueue's queues (ResourceFlavor, Cohort, ClusterQueues,
LocalQueues, WorkloadPriorityClasses); a Job asking for gpupool.io/gpu units is admitted (Kueue
unsuspends it, the Job controller makes its pod, kwok runs it); a second one over the team's
quota waits with Kueue's reason and is admitted once the first ends."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.kube_cluster import controlplane, kwok_stages  # noqa: E402
from tools.kube_cluster.kueue import Kueue  # noqa: E402

pytestmark = pytest.mark.cluster

EXAMPLES = ROOT / "deploy" / "examples" / "kueue"
WAIT = 180.0  # a loaded machine: waited for, generously


@pytest.fixture(scope="module")
def kueue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    if os.geteuid() != 0:
        pytest.skip(
            "Kueue's controller reads its metrics certificate from /etc/kueue: it runs in a mount namespace, as root"
        )
    try:
        controlplane.build()
        bin_dir = controlplane.build(["kueue"])
    except controlplane.GoMissing as err:
        pytest.skip(f"no control plane here: {err}")
    with controlplane.running(tmp_path_factory.mktemp("kq"), bin_dir, nodes=2, gpus=4) as plane:
        queue = Kueue(plane, bin_dir).start()
        try:
            queue.kubectl("apply", "-k", str(EXAMPLES))
            yield queue
        finally:
            queue.stop()


def job(name: str, namespace: str, units: int, run_for: str = "", priority: str = "") -> Dict[str, Any]:
    """A Job for the team's LocalQueue asking `units` of gpupool.io/gpu (100 a GPU), of the
    WorkloadPriorityClass `priority` (deploy/examples/kueue: high, low) if given."""
    annotations = {kwok_stages.RUN_FOR_ANNOTATION: run_for} if run_for else {}
    labels = {"kueue.x-k8s.io/queue-name": "gpus"}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "busybox",
                            "resources": {"requests": {"cpu": "1"}, "limits": {"gpupool.io/gpu": str(units)}},
                        }
                    ],
                },
            },
        },
    }


def workload(kueue: Kueue, namespace: str, job_name: str) -> Dict[str, Any]:
    """The Workload Kueue made for the Job (empty until it exists)."""
    found = json.loads(kueue.kubectl("-n", namespace, "get", "workloads.kueue.x-k8s.io", "-o", "json"))
    owned = [w for w in found["items"] if any(o["name"] == job_name for o in w["metadata"].get("ownerReferences", []))]
    return owned[0] if owned else {}


def condition(obj: Dict[str, Any], kind: str) -> Dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def get(kueue: Kueue, *args: str) -> Dict[str, Any]:
    return dict(json.loads(kueue.kubectl("get", "-o", "json", *args)))


def test_a_job_is_admitted_and_one_over_quota_waits_with_kueues_reason(kueue):
    # team-a: 200 units nominal, borrowing from team-b which lends at most 100: 300 at most.
    kueue.kubectl("apply", "-f", "-", stdin=json.dumps(job("first", "team-a", 300, run_for="40s")))
    admitted = wait_until(
        lambda: condition(w := workload(kueue, "team-a", "first"), "Admitted").get("status") == "True" and w,
        WAIT,
        "the first Job's Workload admitted",
        interval=0.5,
    )
    assert admitted["status"]["admission"]["clusterQueue"] == "team-a"
    wait_until(
        lambda: get(kueue, "-n", "team-a", "job", "first")["spec"].get("suspend") is False, WAIT, "Kueue unsuspends it"
    )
    wait_until(
        lambda: (
            [p["status"].get("phase") for p in get(kueue, "-n", "team-a", "pods", "-l", "job-name=first")["items"]]
            == ["Running"]
        ),
        WAIT,
        "its pod Running",
        interval=0.5,
    )

    kueue.kubectl("apply", "-f", "-", stdin=json.dumps(job("second", "team-a", 100)))
    pending = wait_until(
        lambda: condition(w := workload(kueue, "team-a", "second"), "QuotaReserved").get("reason") == "Pending" and w,
        WAIT,
        "the second Job's Workload pending",
        interval=0.5,
    )
    message = condition(pending, "QuotaReserved")["message"]
    assert "insufficient" in message and "gpupool.io/gpu" in message, message
    assert get(kueue, "-n", "team-a", "job", "second")["spec"]["suspend"] is True
    assert not get(kueue, "-n", "team-a", "pods", "-l", "job-name=second")["items"]

    # The first ends (kwok, after its run-for): its quota comes back, the second is admitted.
    wait_until(
        lambda: condition(get(kueue, "-n", "team-a", "job", "first"), "Complete").get("status") == "True",
        WAIT,
        "the first Job Complete",
        interval=0.5,
    )
    wait_until(
        lambda: condition(workload(kueue, "team-a", "second"), "Admitted").get("status") == "True",
        WAIT,
        "the second Job's Workload admitted once the first ended",
        interval=0.5,
    )


def test_a_high_priority_job_preempts_the_teams_low_one(kueue):
    # team-b: 200 units nominal, 100 more on loan: 300 at most; the low Job takes all of it.
    kueue.kubectl("apply", "-f", "-", stdin=json.dumps(job("low", "team-b", 300, run_for="10m", priority="low")))
    wait_until(
        lambda: condition(workload(kueue, "team-b", "low"), "Admitted").get("status") == "True",
        WAIT,
        "the low Job admitted",
        interval=0.5,
    )
    kueue.kubectl("apply", "-f", "-", stdin=json.dumps(job("high", "team-b", 200, run_for="10m", priority="high")))
    evicted = wait_until(
        lambda: condition(workload(kueue, "team-b", "low"), "Evicted") or None,
        WAIT,
        "the low Job's Workload evicted",
        interval=0.5,
    )
    assert evicted["status"] == "True" and evicted["reason"] == "Preempted", evicted
    wait_until(
        lambda: condition(workload(kueue, "team-b", "high"), "Admitted").get("status") == "True",
        WAIT,
        "the high Job admitted in its place",
        interval=0.5,
    )
    # Kueue suspends the preempted Job again: the Job controller removes its pod.
    wait_until(
        lambda: (
            get(kueue, "-n", "team-b", "job", "low")["spec"].get("suspend") is True
            and not [
                p
                for p in get(kueue, "-n", "team-b", "pods", "-l", "job-name=low")["items"]
                if p["status"].get("phase") == "Running"
            ]
        ),
        WAIT,
        "the low Job suspended, its pod gone",
        interval=0.5,
    )
