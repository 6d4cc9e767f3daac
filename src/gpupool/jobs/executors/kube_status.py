"""A job's phase from the Kubernetes objects that run it (pure: API JSON in, JobDescription out).

The objects are dicts shaped as the API serves them (camelCase JSON, as `kubectl get -o json`
prints them): batch/v1 Jobs and their Pods for `--target kubernetes`, kubeflow.org/v1
TFJob/PyTorchJob and their Pods for `--target kubeflow`. Kept apart from the executor's I/O
so the rules are tested on documented object shapes without an API server.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..manifests.indexed import INDEX_ANNOTATION as INDEX_KEY  # label (1.28+) and annotation of Indexed Job pods
from ..manifests.indexed import ROLE_LABEL, SUCCESS_ANNOTATION
from ..phase import Phase
from ..spec import SERVICE_ROLES, SuccessPolicy
from .base import JobDescription, ReplicaDescription

KF_TYPE_LABEL = "training.kubeflow.org/replica-type"  # the operator's, lower case: master, worker, ps ...
KF_INDEX_LABEL = "training.kubeflow.org/replica-index"
_LEADS = ("chief", "master", "worker")  # who decides a job with successPolicy chief, in this order

Obj = Mapping[str, Any]
Times = Tuple[Optional[float], Optional[float]]  # submitted, started


def _job(
    name: str, target: str, phase: Phase, message: str, reps: List[ReplicaDescription], times: Times,
    finished: Optional[float] = None,
) -> JobDescription:  # fmt: skip
    return JobDescription(
        name=name,
        target=target,
        status=phase,
        message=message,
        restarts=sum(r.restarts for r in reps),
        submitted_at=times[0],
        started_at=times[1],
        finished_at=finished,
        replicas=reps,
    )


def replica_name(pod: Obj) -> str:
    """`worker-1`: the operator's replica type and index, else gpupool's role and completion index."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if KF_TYPE_LABEL in labels:
        return f"{labels[KF_TYPE_LABEL].lower()}-{labels.get(KF_INDEX_LABEL, '0')}"
    index = labels.get(INDEX_KEY) or (meta.get("annotations") or {}).get(INDEX_KEY, "0")
    return f"{labels.get(ROLE_LABEL, 'replica')}-{index}"


def condition(obj: Obj, kind: str) -> Optional[Dict[str, Any]]:
    """The condition `kind` of `obj` when its status is "True"."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _says(cond: Mapping[str, Any]) -> str:
    return ": ".join(str(p) for p in (cond.get("reason"), cond.get("message")) if p) or str(cond.get("type"))


def _time(text: Any) -> Optional[float]:
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _main_status(pod: Obj) -> Dict[str, Any]:
    """The status of the pod's first (the replica's) container."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    name = containers[0].get("name")
    found = [s for s in statuses if s.get("name") == name] or statuses[:1]
    return dict(found[0]) if found else {}


def pod_phase(pod: Obj) -> Tuple[Phase, str]:
    """A pod's phase as a replica's, and why it is not running where the pod says."""
    status = pod.get("status") or {}
    main = _main_status(pod)
    waiting = (main.get("state") or {}).get("waiting") or {}
    phase = {
        "Pending": Phase.PENDING,
        "Running": Phase.RUNNING,
        "Succeeded": Phase.SUCCEEDED,
        "Failed": Phase.FAILED,
    }.get(status.get("phase", ""), Phase.UNKNOWN)
    if (pod.get("metadata") or {}).get("deletionTimestamp") and not phase.is_terminal:
        return Phase.STOPPED, "pod is being deleted"
    if phase is Phase.RUNNING and waiting and main.get("restartCount", 0) > 0:
        return Phase.RESTARTING, _says(waiting)
    if phase is Phase.PENDING:
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return phase, _says(cond)
        for init in status.get("initContainerStatuses") or []:
            init_waiting = (init.get("state") or {}).get("waiting") or {}
            if init_waiting.get("reason") not in (None, "PodInitializing"):
                return phase, f"init container {init.get('name')}: {_says(init_waiting)}"
        if waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return phase, _says(waiting)
    if phase is Phase.FAILED and status.get("reason"):
        return phase, _says(status)
    return phase, ""


def _exit_code(pod: Obj) -> Optional[int]:
    main = _main_status(pod)
    for key in ("state", "lastState"):
        term = (main.get(key) or {}).get("terminated")
        if term is not None and "exitCode" in term:
            return int(term["exitCode"])
    return None


def replicas_of(pods: Sequence[Obj]) -> Tuple[List[ReplicaDescription], Dict[str, str]]:
    """One description per replica, from its newest pod; older pods of the same replica (a
    Job's retries) count as restarts. Also the reasons of replicas that wait or failed."""
    by_name: Dict[str, List[Obj]] = {}
    for pod in pods:
        by_name.setdefault(replica_name(pod), []).append(pod)
    out: List[ReplicaDescription] = []
    reasons: Dict[str, str] = {}
    for name in sorted(by_name, key=_replica_order):
        tries = sorted(by_name[name], key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
        newest = tries[-1]
        phase, why = pod_phase(newest)
        restarts = sum(int(s.get("restartCount") or 0) for p in tries for s in _statuses(p)) + len(tries) - 1
        out.append(ReplicaDescription(name, phase, _exit_code(newest), restarts, _node(newest)))
        if why:
            reasons[name] = why
    return out, reasons


def _statuses(pod: Obj) -> List[Dict[str, Any]]:
    return list((pod.get("status") or {}).get("containerStatuses") or [])


def _node(pod: Obj) -> str:
    node = (pod.get("spec") or {}).get("nodeName")
    return f"node {node}" if node else ""


def _replica_order(name: str) -> Tuple[int, str, int]:
    role, _, index = name.rpartition("-")
    rank = {"chief": 0, "master": 0, "worker": 1, "ps": 2, "evaluator": 3}.get(role, 4)
    return rank, role, int(index) if index.isdigit() else 0


def _from_replicas(
    name: str, target: str, reps: List[ReplicaDescription], reasons: Dict[str, str], times: Times
) -> JobDescription:
    """Running, restarting or pending, read from the replicas (the job has no verdict yet)."""
    phases = {r.status for r in reps}
    if Phase.RESTARTING in phases:
        phase = Phase.RESTARTING
    elif Phase.RUNNING in phases:
        phase = Phase.RUNNING
    else:
        phase = Phase.PENDING
    message = "; ".join(f"{n}: {why}" for n, why in reasons.items())
    if not reps:
        message = "no pods yet"
    return _job(name, target, phase, message, reps, times)


def describe_indexed(name: str, jobs: Sequence[Obj], pods: Sequence[Obj], target: str = "kubernetes") -> JobDescription:
    """A job of one Indexed Job per role (`--target kubernetes`): failed when any role's Job
    failed; succeeded by the spec's success policy (the lead role's Job complete, or every
    training role's); else read from the pods."""
    reps, reasons = replicas_of(pods)
    created = [_time((j.get("metadata") or {}).get("creationTimestamp")) for j in jobs]
    started = [_time((j.get("status") or {}).get("startTime")) for j in jobs]
    times = (min((t for t in created if t), default=None), min((t for t in started if t), default=None))
    if not jobs:
        return _job(name, target, Phase.CANCELLED, "deleted", reps, times)
    roles = {_role(j): j for j in jobs}
    # A verdict stands even while the roles left running are deleted (Executor.wait winds them down).
    left = ", ".join(_role(j) for j in unfinished(jobs))
    after = f"; {left} still running: gpupool cancel {name} stops them" if left else ""
    for role, job in roles.items():
        failed = condition(job, "Failed") or condition(job, "FailureTarget")
        if failed:
            finished = _time(failed.get("lastTransitionTime"))
            return _job(name, target, Phase.FAILED, f"{role}: {_says(failed)}{after}", reps, times, finished)
    policy = _success_policy(jobs)
    training = [r for r in roles if r not in SERVICE_ROLES]
    lead = next((r for r in _LEADS if r in roles), training[0] if training else None)
    done = {r: _complete(j) for r, j in roles.items()}
    verdict = None
    if policy is SuccessPolicy.CHIEF and lead is not None and done[lead]:
        verdict = f"{lead} completed"
    elif training and all(done[r] for r in training):
        verdict = "all workers completed"
    if verdict:
        finished = max((t for r in training if (t := _completed_at(roles[r])) is not None), default=None)
        return _job(name, target, Phase.SUCCEEDED, verdict + after, reps, times, finished)
    if any((j.get("metadata") or {}).get("deletionTimestamp") for j in jobs):
        return _job(name, target, Phase.CANCELLED, "deleted", reps, times)
    suspended = [r for r, j in roles.items() if condition(j, "Suspended")]
    if suspended:
        return _job(name, target, Phase.PENDING, f"suspended: {', '.join(suspended)}", reps, times)
    return _from_replicas(name, target, reps, reasons, times)


def unfinished(jobs: Sequence[Obj]) -> List[Obj]:
    """Role Jobs that neither completed nor failed, and are not being deleted: after the job's
    verdict, these are the servers (ps, evaluator) or peers still holding GPUs."""
    return [
        j
        for j in jobs
        if not (_complete(j) or condition(j, "Failed") or condition(j, "FailureTarget"))
        and not (j.get("metadata") or {}).get("deletionTimestamp")
    ]


def _role(job: Obj) -> str:
    meta = job.get("metadata") or {}
    return str((meta.get("labels") or {}).get(ROLE_LABEL) or meta.get("name", "?"))


def _success_policy(jobs: Sequence[Obj]) -> SuccessPolicy:
    for job in jobs:
        value = ((job.get("metadata") or {}).get("annotations") or {}).get(SUCCESS_ANNOTATION)
        if value:
            try:
                return SuccessPolicy(value)
            except ValueError:
                pass
    return SuccessPolicy.CHIEF


def _complete(job: Obj) -> bool:
    # SuccessCriteriaMet (1.31+, a successPolicy was met) comes before Complete, while pods end.
    return bool(condition(job, "Complete") or condition(job, "SuccessCriteriaMet"))


def _completed_at(job: Obj) -> Optional[float]:
    return _time((job.get("status") or {}).get("completionTime"))


def describe_kubeflow(name: str, obj: Obj, pods: Sequence[Obj], target: str = "kubeflow") -> JobDescription:
    """A TFJob or PyTorchJob from the training operator's conditions (Created, Running,
    Restarting, Succeeded, Failed, Suspended; the operator keeps at most one of Running and
    Restarting true) and its pods; replicas from `replicaStatuses` when the pods are gone."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    reps, reasons = replicas_of(pods)
    if not reps:
        reps = _from_replica_statuses(status.get("replicaStatuses") or {})
    times = (_time(meta.get("creationTimestamp")), _time(status.get("startTime")))
    finished = _time(status.get("completionTime"))
    if meta.get("deletionTimestamp"):
        return _job(name, target, Phase.CANCELLED, "deleted", reps, times)
    for kind, phase in (("Failed", Phase.FAILED), ("Succeeded", Phase.SUCCEEDED)):
        cond = condition(obj, kind)
        if cond:
            return _job(
                name, target, phase, _says(cond), reps, times, finished or _time(cond.get("lastTransitionTime"))
            )
    if condition(obj, "Suspended"):
        return _job(name, target, Phase.PENDING, "suspended", reps, times)
    restarting = condition(obj, "Restarting")
    if restarting:
        return _job(name, target, Phase.RESTARTING, _says(restarting), reps, times)
    if condition(obj, "Running"):
        return _job(name, target, Phase.RUNNING, "; ".join(f"{n}: {w}" for n, w in reasons.items()), reps, times)
    described = _from_replicas(name, target, reps, reasons, times)
    # Created, or no condition yet: the operator has not seen every pod run.
    phase = Phase.PENDING if described.status is Phase.RUNNING else described.status
    return _job(name, target, phase, described.message, reps, times)


def _from_replica_statuses(statuses: Mapping[str, Any]) -> List[ReplicaDescription]:
    """Counts per replica type (`{"Worker": {"succeeded": 2}}`) as named replicas."""
    out: List[ReplicaDescription] = []
    for rtype in sorted(statuses, key=lambda t: _replica_order(f"{t.lower()}-0")):
        counts = statuses[rtype] or {}
        index = 0
        for key, phase in (("active", Phase.RUNNING), ("succeeded", Phase.SUCCEEDED), ("failed", Phase.FAILED)):
            for _ in range(int(counts.get(key) or 0)):
                out.append(ReplicaDescription(f"{rtype.lower()}-{index}", phase))
                index += 1
    return out
