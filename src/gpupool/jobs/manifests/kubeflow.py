"""TFJob and PyTorchJob (kubeflow.org/v1) for clusters running the Kubeflow training operator.

The operator writes TF_CONFIG, MASTER_ADDR/PORT, WORLD_SIZE, RANK and PET_*
itself, so these manifests carry only the spec's env, gpupool's job
variables and the gpupool GPU resources the webhook turns into shares.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

from ...core.errors import InvalidInput
from ..environment import ROLE_ENV, job_env
from ..spec import Framework, JobSpec, RoleSpec, SuccessPolicy
from .indexed import JOB_DIR, POD_SECURITY, image_of, job_container, job_labels, pod_annotations, setup_containers

# Our role names -> the operator's replica types.
TF_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


def _container(spec: JobSpec, role: RoleSpec, name: str, port_name: str) -> Dict[str, Any]:
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [{"name": k, "value": v} for k, v in spec.env + role.env]
    env += [{"name": k, "value": v} for k, v in job_env(spec.name, JOB_DIR, spec.checkpoints).items()]
    env += [{"name": ROLE_ENV, "value": role.name}]
    # the operator finds its container by the default name it is given here
    return job_container(spec, role, name, list(role.command), env, port_name)


def _replica_spec(spec: JobSpec, role: RoleSpec, replicas: int, container: str, port: str) -> Dict[str, Any]:
    pod: Dict[str, Any] = {
        "securityContext": dict(POD_SECURITY),
        "containers": [_container(spec, role, container, port)],
        "volumes": [{"name": "gpupool-job", "emptyDir": {}}],
    }
    init = setup_containers(spec, image_of(spec, role))
    if init:
        pod["initContainers"] = init
    return {
        "replicas": replicas,
        "restartPolicy": spec.restart_policy.value,  # Never | OnFailure | ExitCode, as the operator names them
        "template": {
            "metadata": {"labels": job_labels(spec, role.name), "annotations": pod_annotations(spec, role)},
            "spec": pod,
        },
    }


def _run_policy(spec: JobSpec) -> Dict[str, Any]:
    policy: Dict[str, Any] = {"backoffLimit": spec.backoff_limit, "cleanPodPolicy": "Running"}
    if spec.active_deadline_seconds is not None:
        policy["activeDeadlineSeconds"] = int(math.ceil(spec.active_deadline_seconds))
    return policy


def tfjob(spec: JobSpec) -> Dict[str, Any]:
    body: Dict[str, Any] = {
        "runPolicy": _run_policy(spec),
        "tfReplicaSpecs": {
            TF_TYPES[r.name]: _replica_spec(spec, r, r.replicas, "tensorflow", "tfjob-port") for r in spec.roles
        },
    }
    if spec.success_policy is SuccessPolicy.ALL_WORKERS:
        body["successPolicy"] = "AllWorkers"
    return _object(spec, "TFJob", body)


def pytorchjob(spec: JobSpec) -> Dict[str, Any]:
    """Master + Worker; a spec with workers only runs worker 0 as the Master (rank 0)."""
    master, worker = spec.role("master"), spec.role("worker")
    replica_specs: Dict[str, Any] = {}
    if master is not None:
        replica_specs["Master"] = _replica_spec(spec, master, 1, "pytorch", "pytorchjob-port")
        if worker is not None:
            replica_specs["Worker"] = _replica_spec(spec, worker, worker.replicas, "pytorch", "pytorchjob-port")
    else:
        assert worker is not None
        replica_specs["Master"] = _replica_spec(spec, worker, 1, "pytorch", "pytorchjob-port")
        if worker.replicas > 1:
            replica_specs["Worker"] = _replica_spec(spec, worker, worker.replicas - 1, "pytorch", "pytorchjob-port")
    return _object(spec, "PyTorchJob", {"runPolicy": _run_policy(spec), "pytorchReplicaSpecs": replica_specs})


def _object(spec: JobSpec, kind: str, body: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": kind,
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": job_labels(spec)},
        "spec": body,
    }


def render(spec: JobSpec) -> List[Dict[str, Any]]:
    """[TFJob] or [PyTorchJob]; other frameworks have no Kubeflow kind here."""
    if spec.framework is Framework.TENSORFLOW:
        return [tfjob(spec)]
    if spec.framework is Framework.PYTORCH:
        return [pytorchjob(spec)]
    raise InvalidInput(
        f"framework: {spec.framework.value} has no Kubeflow kind in gpupool (TFJob and PyTorchJob only); "
        "use --target kubernetes, which needs no operator"
    )
