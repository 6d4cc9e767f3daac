"""Kubernetes manifests the native way: one Indexed Job per role plus one headless Service.

No operator needed. Pods of an Indexed Job get the hostname
`<job>-<role>-<index>` and, with `subdomain: <job>` and a headless Service of
that name, the DNS name `<job>-<role>-<index>.<job>`; those names make the
rendezvous env (TF_CONFIG, MASTER_ADDR, Horovod's store) static. What depends
on the index comes from the completion index through `$(VAR)` expansion, or,
where a rank needs arithmetic, from a tiny `/bin/sh -c` wrapper.
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Any, Dict, List, Optional, Tuple

from ...kube.resources import DOMAIN, GpuAsk
from ..environment import REPLICA_ENV, REPLICA_INDEX_ENV, job_env, replica_env
from ..plan import Endpoints, Replica, replicas
from ..rendezvous.kvstore import TOKEN_ENV
from ..spec import Framework, JobSpec, RestartPolicy, RoleSpec, SuccessPolicy
from .versions import OPTIONAL_POD_CONDITIONS, SUCCESS_POLICY, KubeVersion, has

JOB_LABEL = f"{DOMAIN}/job-name"
ROLE_LABEL = f"{DOMAIN}/replica-role"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
SUCCESS_ANNOTATION = f"{DOMAIN}/success-policy"  # how the executor judges the job from its role Jobs
JOB_DIR = "/gpupool/job"  # an emptyDir per pod; mount a PVC there to share checkpoints
PORTS = {Framework.TENSORFLOW: 2222, Framework.PYTORCH: 23456, Framework.HOROVOD: 2222, Framework.NONE: 2222}
KVSTORE_PORT = 29400
# What a replica gets when its spec does not say: an image (and `submit` warns) and requests.
DEFAULT_IMAGE = "python:3.11-slim"
DEFAULT_CPU = "1"
DEFAULT_MEMORY = "2Gi"
# RuntimeDefault seccomp and no privilege escalation: what Pod Security "baseline" and most of
# "restricted" ask; not runAsNonRoot, since training images often run as root.
POD_SECURITY = {"seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False}
_INDEX = f"$({REPLICA_INDEX_ENV})"
_RANK = "$(GPUPOOL_RANK)"
# Horovod's store token: the Job's UID, which every pod of the one worker Job carries as a label and
# nobody outside the cluster can guess; the kubelet hands it to the env, rendered once per role.
_JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"


def job_labels(spec: JobSpec, role: str = "") -> Dict[str, str]:
    labels = {JOB_LABEL: spec.name, "app.kubernetes.io/managed-by": "gpupool"}
    if role:
        labels[ROLE_LABEL] = role
    return labels


def gpu_resources(role: RoleSpec) -> Dict[str, Any]:
    """`gpupool.io/gpu-amount` + `gpu-percent` (or `gpu-memory`): what the mutating webhook reads."""
    if role.gpu is None:
        return {}
    return {"limits": GpuAsk.of_request(role.gpu).limits()}


def container_resources(role: RoleSpec) -> Dict[str, Any]:
    """cpu and memory requests from the role's `resources` (else the defaults), a memory limit
    equal to the request when the role names one, and the GPU share's limits."""
    out: Dict[str, Any] = {
        "requests": {
            "cpu": role.cpu or DEFAULT_CPU,
            "memory": f"{role.memory_mib}Mi" if role.memory_mib is not None else DEFAULT_MEMORY,
        }
    }
    limits = dict(gpu_resources(role).get("limits", {}))
    if role.memory_mib is not None:
        limits["memory"] = f"{role.memory_mib}Mi"
    if limits:
        out["limits"] = limits
    return out


def image_of(spec: JobSpec, role: RoleSpec) -> str:
    return role.image or spec.image or DEFAULT_IMAGE


def job_container(
    spec: JobSpec, role: RoleSpec, name: str, command: List[str], env: List[Dict[str, Any]], port_name: str
) -> Dict[str, Any]:
    """A replica's container: image, command, env, rendezvous port, job volume and GPU resources."""
    container: Dict[str, Any] = {
        "name": name,
        "image": image_of(spec, role),
        "command": command,
        "env": env,
        "ports": [{"containerPort": PORTS[spec.framework], "name": port_name}],
        "volumeMounts": [{"name": "gpupool-job", "mountPath": JOB_DIR}],
    }
    if spec.working_dir:
        container["workingDir"] = spec.working_dir
    container["resources"] = container_resources(role)
    container["securityContext"] = dict(CONTAINER_SECURITY)
    return _with_storage_secret(spec, container)


def pod_annotations(spec: JobSpec, role: RoleSpec) -> Dict[str, str]:
    out = dict(spec.annotations)
    if role.gpu is not None:
        out[f"{DOMAIN}/policy"] = spec.placement.value
        if role.gpu.filters:
            out[f"{DOMAIN}/filter"] = ",".join(f.to_text() for f in role.gpu.filters)
    return out


def cluster_endpoints(spec: JobSpec, reps: Tuple[Replica, ...]) -> Endpoints:
    """Stable DNS names of every replica, the framework's port, Horovod's store on worker 0."""
    hosts = {r.name: f"{spec.name}-{r.role}-{r.index}.{spec.name}" for r in reps}
    port = PORTS[spec.framework]
    rendezvous = None
    if spec.framework is Framework.HOROVOD:
        rendezvous = (hosts[reps[0].name], KVSTORE_PORT)
    token = f"$({TOKEN_ENV})" if rendezvous else ""
    return Endpoints(hosts, {r.name: port for r in reps}, rendezvous, token)


def role_env(spec: JobSpec, role: RoleSpec, offset: int) -> Tuple[List[Dict[str, Any]], Dict[str, str]]:
    """Env list of one role's pod template, and the variables the shell wrapper must export.

    The env is rendered for a symbolic replica whose index and rank are
    `$(GPUPOOL_REPLICA_INDEX)` and `$(GPUPOOL_RANK)`; the kubelet expands them
    per pod. A rank offset (workers after a master or chief) needs arithmetic,
    so then the variables holding the rank move into the wrapper.
    """
    reps = replicas(spec)
    # index and rank are $(...) placeholders the kubelet expands: a Replica's ints only in name here.
    symbolic = Replica(role.name, _INDEX, _RANK, None)  # type: ignore[arg-type]
    env = replica_env(spec, reps, cluster_endpoints(spec, reps), symbolic, JOB_DIR, {})
    env[REPLICA_ENV] = f"{role.name}-{_INDEX}"
    if "TF_CONFIG" in env:
        # The index must be a JSON number in TF_CONFIG, so unquote the placeholder.
        env["TF_CONFIG"] = env["TF_CONFIG"].replace(json.dumps(_INDEX), _INDEX)
    env.pop(REPLICA_INDEX_ENV, None)
    items: List[Dict[str, Any]] = [
        {
            "name": REPLICA_INDEX_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}},
        },
    ]
    if env.pop(TOKEN_ENV, None) is not None:  # before the variables whose $(...) names it
        items.append(
            {"name": TOKEN_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{_JOB_UID_LABEL}']"}}}
        )
    wrapped: Dict[str, str] = {}
    if offset == 0:
        items.append({"name": "GPUPOOL_RANK", "value": _INDEX})
    for name, value in env.items():
        if offset and _RANK in value:
            wrapped[name] = value
        else:
            items.append({"name": name, "value": value})
    return items, wrapped


def wrap_command(command: Tuple[str, ...], offset: int, wrapped: Dict[str, str]) -> List[str]:
    """The role's command, behind `/bin/sh -c` when ranks need `index + offset`."""
    if not wrapped:
        return list(command)
    exports = [f"export GPUPOOL_RANK=$((GPUPOOL_REPLICA_INDEX + {offset}))"]
    for name, value in wrapped.items():
        parts = value.split(_RANK)
        exports.append(f"export {name}=" + '"${GPUPOOL_RANK}"'.join(shlex.quote(p) if p else "" for p in parts))
    return ["/bin/sh", "-c", "; ".join(exports) + '; exec "$@"', "gpupool-rank"] + list(command)


def headless_service(spec: JobSpec) -> Dict[str, Any]:
    """Gives every replica pod a stable DNS name; published before ready so rendezvous can start."""
    port = PORTS[spec.framework]
    ports = [{"name": "rendezvous", "port": port, "targetPort": port}]
    if spec.framework is Framework.HOROVOD:
        ports.append({"name": "kvstore", "port": KVSTORE_PORT, "targetPort": KVSTORE_PORT})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": job_labels(spec)},
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: spec.name},
            "publishNotReadyAddresses": True,
            "ports": ports,
        },
    }


def indexed_job(
    spec: JobSpec, role: RoleSpec, offset: int, kube_version: Optional[KubeVersion] = None
) -> Dict[str, Any]:
    """One role as an Indexed Job with the spec's restart, success and deadline policies, as far
    as Kubernetes `kube_version` (None: the newest) has them."""
    env, wrapped = role_env(spec, role, offset)
    command = wrap_command(role.command, offset, wrapped)
    if spec.framework is Framework.HOROVOD and offset == 0:
        command = _with_kvstore(command)
    container = job_container(spec, role, role.name, command, env, "rendezvous")
    pod_spec: Dict[str, Any] = {  # initContainers dropped below when empty
        "subdomain": spec.name,
        "restartPolicy": "OnFailure" if spec.restart_policy is RestartPolicy.ON_FAILURE else "Never",
        "securityContext": dict(POD_SECURITY),
        "initContainers": setup_containers(spec, container["image"]),
        "containers": [container],
        "volumes": [{"name": "gpupool-job", "emptyDir": {}}],
    }
    if not pod_spec["initContainers"]:
        del pod_spec["initContainers"]
    job_spec: Dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": role.replicas,
        "parallelism": role.replicas,
        "backoffLimit": 0 if spec.restart_policy is RestartPolicy.NEVER else spec.backoff_limit,
        "template": {
            "metadata": {"labels": job_labels(spec, role.name), "annotations": pod_annotations(spec, role)},
            "spec": pod_spec,
        },
    }
    if spec.restart_policy is RestartPolicy.EXIT_CODE:
        # 1-127 are the program's own verdict: fail at once; signals (>=128) count against backoffLimit.
        rule: Dict[str, Any] = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": list(range(1, 128))}}
        if not has(kube_version, OPTIONAL_POD_CONDITIONS):
            rule["onPodConditions"] = []
        job_spec["podFailurePolicy"] = {"rules": [rule]}
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = int(math.ceil(spec.active_deadline_seconds))
    if (
        spec.success_policy is SuccessPolicy.CHIEF
        and role.name in ("worker",)
        and spec.role("chief") is None
        and spec.role("master") is None
        and role.replicas > 1
        and has(kube_version, SUCCESS_POLICY)
    ):
        # Worker 0 is the chief: the Job succeeds when index 0 does. Before 1.31 the Job has no
        # successPolicy and succeeds when every worker has.
        job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{spec.name}-{role.name}",
            "namespace": spec.namespace,
            "labels": job_labels(spec, role.name),
            "annotations": {f"{DOMAIN}/framework": spec.framework.value, SUCCESS_ANNOTATION: spec.success_policy.value},
        },
        "spec": job_spec,
    }


def _with_kvstore(command: List[str]) -> List[str]:
    """Worker 0 also serves Horovod's rendezvous store (needs gpupool in the image).

    It listens on the pod's own network (its namespace holds only loopback and the pod IP) and
    takes the token from the env `role_env` gave every worker."""
    start = (
        f'if [ "$GPUPOOL_REPLICA_INDEX" = 0 ]; then python3 -m gpupool.jobs.rendezvous.kvstore '
        f'--host 0.0.0.0 --port {KVSTORE_PORT} & fi; exec "$@"'
    )
    return ["/bin/sh", "-c", start, "gpupool-kvstore"] + command


def setup_containers(spec: JobSpec, image: str) -> List[Dict[str, Any]]:
    """The spec's setup command as an init container: each pod prepares its own job dir."""
    if not spec.setup:
        return []
    env = [{"name": k, "value": v} for k, v in spec.env]
    env += [{"name": k, "value": v} for k, v in job_env(spec.name, JOB_DIR, spec.checkpoints).items()]
    container: Dict[str, Any] = {
        "name": "setup",
        "image": image,
        "command": list(spec.setup),
        "env": env,
        "volumeMounts": [{"name": "gpupool-job", "mountPath": JOB_DIR}],
        "resources": {"requests": {"cpu": DEFAULT_CPU, "memory": DEFAULT_MEMORY}},
        "securityContext": dict(CONTAINER_SECURITY),
    }
    return [_with_storage_secret(spec, container)]


def _with_storage_secret(spec: JobSpec, container: Dict[str, Any]) -> Dict[str, Any]:
    """The spec's storageSecret as the container's envFrom: its keys (AWS_ACCESS_KEY_ID ...)
    become env the storage SDKs read, and the manifest holds a reference, never the values."""
    if spec.storage_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.storage_secret}}]
    return container


def render(spec: JobSpec, kube_version: Optional[KubeVersion] = None) -> List[Dict[str, Any]]:
    """The headless Service first (DNS before pods), then one Indexed Job per role in rank order,
    for Kubernetes `kube_version` (None: the newest)."""
    out = [headless_service(spec)]
    offset = 0
    for role in spec.roles:
        out.append(indexed_job(spec, role, offset, kube_version))
        offset += role.replicas
    return out
