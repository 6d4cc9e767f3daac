"""A stand-in for the Kubernetes API server and its controllers, for the Kubernetes executor.

It holds objects exactly as the API serves them (camelCase JSON): the executor's rendered
manifests, and the Pods that the Job controller or the Kubeflow training operator would
make from them, with the labels those controllers add. Tests move pods and jobs through
their documented states; `check()` validates every object against Kubernetes' own schema
(kubernetes-validate) so a fixture cannot drift from the API's shapes.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, Dict, Iterator, List, Optional, Tuple

from gpupool.core.errors import NotFound

GROUP = "kubeflow.org"
T0 = "2026-11-23T10:00:00Z"
_uids = itertools.count(1)


def _uid() -> str:
    return f"00000000-0000-4000-8000-{next(_uids):012d}"


def _matches(labels: Dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, eq, value = term.partition("=")
        if key not in labels or (eq and labels[key] != value):
            return False
    return True


class FakeCluster:
    """The API calls KubernetesExecutor makes (its JobApi), over objects in memory."""

    def __init__(self) -> None:
        self.objects: Dict[Tuple[str, str, str], Dict[str, Any]] = {}
        self.logs: Dict[str, List[str]] = {}  # pod name -> lines
        self.deleted: List[Tuple[str, str]] = []
        self.crds = {"tfjobs", "pytorchjobs"}
        self.version = "v1.33.1"

    def server_version(self) -> str:
        return self.version

    # --- JobApi --------------------------------------------------------------
    def create(self, obj: Dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.update(uid=_uid(), creationTimestamp=T0, resourceVersion="1", generation=1)
        if obj["kind"] == "Job":
            obj["status"] = {}
            labels = {"batch.kubernetes.io/controller-uid": meta["uid"], "batch.kubernetes.io/job-name": meta["name"]}
            labels.update(**{"controller-uid": meta["uid"], "job-name": meta["name"]})
            meta["labels"] = {**meta.get("labels", {}), **labels}
            obj["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": meta["uid"]}}
            obj["spec"]["template"]["metadata"]["labels"].update(labels)
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj

    def _list(self, kind: str, ns: str, selector: str) -> List[Dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (k, n, _), o in sorted(self.objects.items())
            if k == kind and n == ns and _matches(o["metadata"].get("labels") or {}, selector)
        ]

    def jobs(self, ns: str, selector: str) -> List[Dict[str, Any]]:
        return self._list("Job", ns, selector)

    def pods(self, ns: str, selector: str) -> List[Dict[str, Any]]:
        return self._list("Pod", ns, selector)

    def services(self, ns: str, selector: str) -> List[Dict[str, Any]]:
        return self._list("Service", ns, selector)

    def custom_objects(self, ns: str, plural: str, selector: str) -> List[Dict[str, Any]]:
        if plural not in self.crds:
            raise NotFound(f"list {plural} in {ns}: the server could not find the requested resource (HTTP 404)")
        kind = {"tfjobs": "TFJob", "pytorchjobs": "PyTorchJob"}[plural]
        return self._list(kind, ns, selector)

    def custom_object(self, ns: str, plural: str, name: str) -> Dict[str, Any]:
        kind = {"tfjobs": "TFJob", "pytorchjobs": "PyTorchJob"}[plural]
        if plural not in self.crds or (kind, ns, name) not in self.objects:
            raise NotFound(f"get {plural} {ns}/{name}: not found (HTTP 404)")
        return copy.deepcopy(self.objects[(kind, ns, name)])

    def delete(self, kind: str, ns: str, name: str) -> None:
        if (kind, ns, name) not in self.objects:
            raise NotFound(f"delete {kind} {ns}/{name}: not found (HTTP 404)")
        # Foreground deletion: the owner stays, marked, until its pods are gone.
        self.objects[(kind, ns, name)]["metadata"]["deletionTimestamp"] = "2026-11-23T10:30:00Z"
        self.deleted.append((kind, name))

    def log(self, ns: str, pod: str, container: str, follow: bool) -> Iterator[str]:
        yield from list(self.logs.get(pod, []))

    # --- what the controllers do ---------------------------------------------
    def remove(self, kind: str, ns: str, name: str) -> None:
        del self.objects[(kind, ns, name)]

    def job(self, name: str, ns: str = "default") -> Dict[str, Any]:
        return self.objects[("Job", ns, name)]

    def pod(self, name: str, ns: str = "default") -> Dict[str, Any]:
        return self.objects[("Pod", ns, name)]

    def start_indexed(self, job_name: str, ns: str = "default", node: str = "gpu-node-1") -> List[str]:
        """Pods for every index, as the Job controller makes them (Pending, unscheduled)."""
        return [self.retry_index(job_name, i, ns, node) for i in range(self.job(job_name, ns)["spec"]["completions"])]

    def retry_index(self, job_name: str, index: int, ns: str = "default", node: str = "gpu-node-1") -> str:
        """A (new) pod for one completion index."""
        job = self.job(job_name, ns)
        template = copy.deepcopy(job["spec"]["template"])
        tries = sum(1 for k in self.objects if k[0] == "Pod" and k[2].startswith(f"{job_name}-{index}-"))
        name = f"{job_name}-{index}-{'abcdefgh'[tries]}x7k2"
        labels = {**template["metadata"]["labels"], "batch.kubernetes.io/job-completion-index": str(index)}
        annotations = {
            **template["metadata"].get("annotations", {}),
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job["metadata"]["uid"]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": _uid(),
                "creationTimestamp": f"2026-11-23T10:0{tries}:00Z",
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": {**template["spec"], "hostname": f"{job_name}-{index}"},
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        self.objects[("Pod", ns, name)] = pod
        job["status"].setdefault("startTime", "2026-11-23T10:00:01Z")
        return name

    def start_kubeflow(self, kind: str, name: str, ns: str = "default") -> List[str]:
        """Pods for every replica, as the training operator makes them, with its labels."""
        obj = self.objects[(kind, ns, name)]
        specs = obj["spec"]["tfReplicaSpecs" if kind == "TFJob" else "pytorchReplicaSpecs"]
        made = []
        for rtype, rspec in specs.items():
            for i in range(rspec["replicas"]):
                template = copy.deepcopy(rspec["template"])
                labels = {
                    **template["metadata"]["labels"],
                    "training.kubeflow.org/job-name": name,
                    "training.kubeflow.org/operator-name": f"{kind.lower().replace('job', '')}job-controller",
                    "training.kubeflow.org/replica-type": rtype.lower(),
                    "training.kubeflow.org/replica-index": str(i),
                }
                if rtype in ("Master", "Chief") or (rtype == "Worker" and "Chief" not in specs and i == 0):
                    labels["training.kubeflow.org/job-role"] = "master"
                pod_name = f"{name}-{rtype.lower()}-{i}"
                self.objects[("Pod", ns, pod_name)] = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod_name,
                        "namespace": ns,
                        "uid": _uid(),
                        "creationTimestamp": T0,
                        "labels": labels,
                        "annotations": template["metadata"].get("annotations", {}),
                        "ownerReferences": [
                            {
                                "apiVersion": "kubeflow.org/v1",
                                "kind": kind,
                                "name": name,
                                "uid": obj["metadata"]["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": {**template["spec"], "hostname": pod_name, "subdomain": name},
                    "status": {"phase": "Pending", "qosClass": "BestEffort"},
                }
                made.append(pod_name)
        return made


def _container_status(pod: Dict[str, Any], state: Dict[str, Any], restarts: int = 0, **extra: Any) -> Dict[str, Any]:
    main = pod["spec"]["containers"][0]
    return {
        "name": main["name"],
        "image": main["image"],
        "imageID": f"docker.io/{main['image']}@sha256:{'0' * 64}",
        "containerID": f"containerd://{'1' * 64}",
        "ready": "running" in state,
        "started": "running" in state,
        "restartCount": restarts,
        "state": state,
        "lastState": extra.pop("lastState", {}),
        **extra,
    }


def unschedulable(pod: Dict[str, Any], message: str) -> None:
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "lastProbeTime": None,
            "lastTransitionTime": T0,
            "reason": "Unschedulable",
            "message": message,
        }
    ]


def image_pull_backoff(pod: Dict[str, Any]) -> None:
    image = pod["spec"]["containers"][0]["image"]
    pod["spec"]["nodeName"] = "gpu-node-1"
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}}
    status = _container_status(pod, waiting)
    status["imageID"] = ""  # not pulled yet: the API sends it empty (required), no containerID
    status.pop("containerID")
    pod["status"].update(hostIP="10.0.0.5", startTime=T0, containerStatuses=[status])


def running(pod: Dict[str, Any], restarts: int = 0, last_exit: Optional[int] = None) -> None:
    pod["spec"]["nodeName"] = "gpu-node-1"
    last = {}
    if last_exit is not None:
        last = {"terminated": {"exitCode": last_exit, "reason": "Error", "startedAt": T0, "finishedAt": T0}}
    status = _container_status(pod, {"running": {"startedAt": T0}}, restarts, lastState=last)
    pod["status"].update(phase="Running", hostIP="10.0.0.5", podIP="10.1.0.7", startTime=T0)
    pod["status"]["containerStatuses"] = [status]
    pod["status"]["conditions"] = [
        {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": T0}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]


def crash_looping(pod: Dict[str, Any], restarts: int, last_exit: int) -> None:
    running(pod, restarts, last_exit)
    status = pod["status"]["containerStatuses"][0]
    status["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}}
    status["ready"] = status["started"] = False


def terminated(pod: Dict[str, Any], exit_code: int) -> None:
    running(pod)
    term = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "startedAt": T0,
        "finishedAt": "2026-11-23T10:10:00Z",
        "containerID": f"containerd://{'1' * 64}",
    }
    status = pod["status"]["containerStatuses"][0]
    status.update(state={"terminated": term}, ready=False, started=False)
    pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"


def job_condition(job: Dict[str, Any], kind: str, reason: str = "", message: str = "") -> None:
    cond = {
        "type": kind,
        "status": "True",
        "lastProbeTime": "2026-11-23T10:10:00Z",
        "lastTransitionTime": "2026-11-23T10:10:00Z",
    }
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    job["status"].setdefault("conditions", []).append(cond)
    if kind == "Complete":
        job["status"]["completionTime"] = "2026-11-23T10:10:00Z"


def kubeflow_condition(obj: Dict[str, Any], kind: str, reason: str, message: str) -> None:
    """The operator's setCondition: Running and Restarting replace each other; Running turns
    False when the job succeeds or fails."""
    status = obj.setdefault("status", {})
    kept = []
    for cond in status.get("conditions", []):
        if cond["type"] == kind or {cond["type"], kind} == {"Running", "Restarting"}:
            continue
        if kind in ("Succeeded", "Failed") and cond["type"] == "Running":
            cond = {**cond, "status": "False"}
        kept.append(cond)
    t = "2026-11-23T10:10:00Z"
    kept.append(
        {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastUpdateTime": t,
            "lastTransitionTime": t,
        }
    )
    status["conditions"] = kept
    status.setdefault("startTime", "2026-11-23T10:00:01Z")
    if kind in ("Succeeded", "Failed"):
        status["completionTime"] = t
