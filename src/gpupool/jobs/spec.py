"""The job spec: a pure, validated description of a distributed training job.

A spec is written once in YAML and run by any executor (local processes,
Kubernetes Indexed Jobs, Kubeflow TFJob/PyTorchJob). Its layout is validated
by the models of `spec_model`; errors name the field by its path
(``roles.worker.gpu.fraction``), the value and how to fix it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..core.errors import InvalidInput
from ..core.model import GpuRequest, Policy


class SpecError(InvalidInput):
    """A job spec field is invalid; the message starts with the field's path."""

    code = "invalid_spec"

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class Framework(enum.Enum):
    """Which rendezvous env the replicas get."""

    PYTORCH = "pytorch"
    TENSORFLOW = "tensorflow"
    HOROVOD = "horovod"
    NONE = "none"


class RestartPolicy(enum.Enum):
    """When a failed replica is started again (Kubernetes/Kubeflow names)."""

    NEVER = "Never"
    ON_FAILURE = "OnFailure"
    EXIT_CODE = "ExitCode"  # retry exit codes >= 128 (signals, OOM kill), fail on 1..127

    def should_retry(self, exit_code: int) -> bool:
        """Whether a replica that ended with `exit_code` (non-zero) may be retried."""
        if self is RestartPolicy.NEVER:
            return False
        if self is RestartPolicy.ON_FAILURE:
            return True
        return exit_code >= 128


class SuccessPolicy(enum.Enum):
    """When the job as a whole has succeeded."""

    CHIEF = "chief"  # the chief (or master, or worker 0 when neither exists) exited 0
    ALL_WORKERS = "allWorkers"  # every chief/master/worker replica exited 0


# Roles each framework knows, in rank order (the first role listed holds rank 0).
ROLES: Dict[Framework, Tuple[str, ...]] = {
    Framework.TENSORFLOW: ("chief", "worker", "ps", "evaluator"),
    Framework.PYTORCH: ("master", "worker"),
    Framework.HOROVOD: ("worker",),
    Framework.NONE: ("chief", "master", "worker", "ps", "evaluator"),
}
# Roles that serve others and never finish by themselves: stopped once the job is done.
SERVICE_ROLES = ("ps", "evaluator")
MAX_NAME = 40  # leaves room for "-worker-12" and a 63-character DNS label on Kubernetes


@dataclass(frozen=True)
class RoleSpec:
    """One role of the job: `replicas` identical processes sharing command, env and GPU share."""

    name: str
    replicas: int
    command: Tuple[str, ...]
    env: Tuple[Tuple[str, str], ...] = ()
    gpu: Optional[GpuRequest] = None
    image: str = ""
    cpu: str = ""  # a Kubernetes cpu quantity per replica ("2", "500m"); "" = the executor's default
    memory_mib: Optional[int] = None  # memory per replica (not GPU memory); None = the executor's default


@dataclass(frozen=True)
class JobSpec:
    """A whole job: roles plus restart, success and deadline policies."""

    name: str
    framework: Framework
    roles: Tuple[RoleSpec, ...]
    restart_policy: RestartPolicy = RestartPolicy.NEVER
    backoff_limit: int = 3
    backoff_seconds: float = 1.0
    success_policy: SuccessPolicy = SuccessPolicy.CHIEF
    active_deadline_seconds: Optional[float] = None
    env: Tuple[Tuple[str, str], ...] = ()
    setup: Tuple[str, ...] = ()
    working_dir: str = ""
    placement: Policy = Policy.SPREAD
    image: str = ""  # "" = none named: cluster targets run DEFAULT_IMAGE and `submit` warns
    namespace: str = "default"
    annotations: Tuple[Tuple[str, str], ...] = field(default=())
    queue: str = ""  # the pool queue of the job's gang claim ("" = none)
    priority: int = 0  # its priority inside that queue
    # Where the job's checkpoints live (a bucket URL or a path), given to every replica as
    # GPUPOOL_CHECKPOINTS; a preempted or requeued job resumes from there on any node.
    checkpoints: str = ""
    # The Kubernetes Secret whose keys become the replicas' env (AWS_*, AZURE_STORAGE_*,
    # GOOGLE_APPLICATION_CREDENTIALS ...): credentials never go in the spec itself.
    storage_secret: str = ""

    def role(self, name: str) -> Optional[RoleSpec]:
        """The role called `name`, or None."""
        return next((r for r in self.roles if r.name == name), None)


def load_spec(path: str) -> JobSpec:
    """Read and validate a YAML job spec file."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as err:
        raise InvalidInput(f"cannot read job spec {path!r}: {err.strerror}; give the path of a YAML file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InvalidInput(f"{path}: not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    return parse_spec(data)


def parse_spec(data: Any) -> JobSpec:
    """Validate a spec given as plain data (parsed YAML or JSON) with `spec_model.JobModel`."""
    # pydantic only where a spec is read: the executors and manifests need the dataclasses alone
    from pydantic import ValidationError

    from .spec_model import JobModel, explain

    if not isinstance(data, Mapping):
        raise SpecError("", "a job spec must be a mapping with at least 'name' and 'roles'")
    try:
        model = JobModel.model_validate(dict(data))
    except ValidationError as err:
        raise SpecError(*explain(err)) from None
    allowed = ROLES[model.framework]
    for role_name in model.roles:
        if role_name not in allowed:
            raise SpecError(
                f"roles.{role_name}",
                f"unknown role for framework {model.framework.value}: use one of {', '.join(allowed)}",
            )
    roles = tuple(
        RoleSpec(
            name=name,
            replicas=role.replicas,
            command=role.command,
            env=tuple(role.env.items()),
            gpu=None if role.gpu is None else role.gpu.request(),
            image=role.image,
            cpu=role.resources.cpu if role.resources else "",
            memory_mib=role.resources.memory if role.resources else None,
        )
        for name, role in sorted(model.roles.items(), key=lambda item: allowed.index(item[0]))
    )
    spec = JobSpec(
        name=model.name,
        framework=model.framework,
        roles=roles,
        restart_policy=model.restart_policy,
        backoff_limit=model.backoff_limit,
        backoff_seconds=model.backoff_seconds,
        success_policy=model.success_policy,
        active_deadline_seconds=model.active_deadline_seconds,
        env=tuple(model.env.items()),
        setup=model.setup or (),
        working_dir=model.working_dir,
        placement=model.placement,
        image=model.image,
        namespace=model.namespace,
        annotations=tuple(model.annotations.items()),
        queue=model.queue,
        priority=model.priority,
        checkpoints=model.checkpoints,
        storage_secret=model.storage_secret,
    )
    _check_framework_rules(spec)
    return spec


def roles_without_image(spec: JobSpec) -> List[str]:
    """Roles that name no image, neither their own nor the job's."""
    return [] if spec.image else [r.name for r in spec.roles if not r.image]


def _check_framework_rules(spec: JobSpec) -> None:
    """Cross-field rules the frameworks impose."""
    for single in ("chief", "master"):
        role = spec.role(single)
        if role is not None and role.replicas != 1:
            raise SpecError(f"roles.{single}.replicas", f"a job has exactly one {single}: set replicas: 1")
    trainers = [r for r in spec.roles if r.name not in SERVICE_ROLES]
    if not trainers:
        raise SpecError("roles", "needs a chief, master or worker role: ps and evaluator alone never finish")
    evaluator = spec.role("evaluator")
    if evaluator is not None and evaluator.replicas != 1:
        raise SpecError("roles.evaluator.replicas", "TensorFlow runs at most one evaluator: set replicas: 1")
    if spec.role("ps") is not None and spec.framework is Framework.TENSORFLOW and spec.role("worker") is None:
        raise SpecError("roles.worker", "ParameterServerStrategy needs workers next to the ps role")


def spec_to_dict(spec: JobSpec) -> Dict[str, Any]:
    """The spec back as plain data, in the YAML layout `parse_spec` reads."""

    def gpu(req: Optional[GpuRequest]) -> Optional[Dict[str, Any]]:
        if req is None:
            return None
        out: Dict[str, Any] = {"count": req.count}
        if req.fraction is not None:
            out["fraction"] = req.fraction
        else:
            out["memory"] = f"{req.memory_mib}Mi"
        if req.filters:
            out["filters"] = [f.to_text() for f in req.filters]
        return out

    roles: Dict[str, Any] = {}
    for r in spec.roles:
        role: Dict[str, Any] = {"replicas": r.replicas, "command": list(r.command)}
        if r.env:
            role["env"] = dict(r.env)
        if r.gpu is not None:
            role["gpu"] = gpu(r.gpu)
        if r.image:
            role["image"] = r.image
        resources: Dict[str, Any] = {}
        if r.cpu:
            resources["cpu"] = r.cpu
        if r.memory_mib is not None:
            resources["memory"] = f"{r.memory_mib}Mi"
        if resources:
            role["resources"] = resources
        roles[r.name] = role
    data: Dict[str, Any] = {
        "name": spec.name,
        "framework": spec.framework.value,
        "roles": roles,
        "restartPolicy": spec.restart_policy.value,
        "backoffLimit": spec.backoff_limit,
        "backoffSeconds": spec.backoff_seconds,
        "successPolicy": spec.success_policy.value,
        "placement": spec.placement.value,
        "namespace": spec.namespace,
    }
    if spec.queue:
        data["queue"] = spec.queue
    if spec.priority:
        data["priority"] = spec.priority
    if spec.image:
        data["image"] = spec.image
    if spec.active_deadline_seconds is not None:
        data["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.env:
        data["env"] = dict(spec.env)
    if spec.setup:
        data["setup"] = list(spec.setup)
    if spec.working_dir:
        data["workingDir"] = spec.working_dir
    if spec.annotations:
        data["annotations"] = dict(spec.annotations)
    if spec.checkpoints:
        data["checkpoints"] = spec.checkpoints
    if spec.storage_secret:
        data["storageSecret"] = spec.storage_secret
    return data
