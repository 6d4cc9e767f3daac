"""The job spec: a pure, validated description of a distributed training job.

A spec is written once in YAML and run by any executor (local processes,
Kubernetes Indexed Jobs, Kubeflow TFJob/PyTorchJob). Validation errors name
the field by its path (``roles.worker.gpu.fraction``) and say how to fix it.
"""

from __future__ import annotations

import enum
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from ..core.errors import GpupoolError, InvalidInput
from ..core.filters import Filter
from ..core.model import GpuRequest, Policy
from ..core.quantity import parse_fraction, parse_memory_mib


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
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_NAME = 40  # leaves room for "-worker-12" and a 63-character DNS label on Kubernetes
_JOB_KEYS = {
    "name",
    "framework",
    "roles",
    "restartPolicy",
    "backoffLimit",
    "backoffSeconds",
    "successPolicy",
    "activeDeadlineSeconds",
    "env",
    "setup",
    "workingDir",
    "placement",
    "image",
    "namespace",
    "annotations",
    "queue",
    "priority",
}
_ROLE_KEYS = {"replicas", "command", "env", "gpu", "image", "restartPolicy", "resources"}
_RESOURCE_KEYS = {"cpu", "memory"}
_CPU_RE = re.compile(r"^(\d+(\.\d+)?|\d+m)$")
_GPU_KEYS = {"count", "amount", "fraction", "memory", "filters"}


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
    """Validate a spec given as plain data (parsed YAML or JSON)."""
    if not isinstance(data, Mapping):
        raise SpecError("", "a job spec must be a mapping with at least 'name' and 'roles'")
    _no_unknown(data, _JOB_KEYS, "")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME:
        raise SpecError(
            "name",
            f"{name!r} is not a valid job name: use lowercase letters, digits and '-', "
            f"starting with a letter, at most {MAX_NAME} characters (e.g. digits-ddp)",
        )
    framework = _enum(Framework, data.get("framework", "none"), "framework")
    roles_data = data.get("roles")
    if not isinstance(roles_data, Mapping) or not roles_data:
        raise SpecError("roles", "give at least one role, e.g. roles: {worker: {replicas: 2, command: [...]}}")
    allowed = ROLES[framework]
    roles = []
    for role_name in sorted(roles_data, key=lambda r: allowed.index(r) if r in allowed else len(allowed)):
        if role_name not in allowed:
            raise SpecError(
                f"roles.{role_name}",
                f"unknown role for framework {framework.value}: use one of {', '.join(allowed)}",
            )
        roles.append(_parse_role(str(role_name), roles_data[role_name]))
    spec = JobSpec(
        name=name,
        framework=framework,
        roles=tuple(roles),
        restart_policy=_enum(RestartPolicy, data.get("restartPolicy", "Never"), "restartPolicy"),
        backoff_limit=_int(data.get("backoffLimit", 3), "backoffLimit", minimum=0),
        backoff_seconds=_number(data.get("backoffSeconds", 1.0), "backoffSeconds", minimum=0.0),
        success_policy=_enum(SuccessPolicy, data.get("successPolicy", "chief"), "successPolicy"),
        active_deadline_seconds=(
            None
            if data.get("activeDeadlineSeconds") is None
            else _number(data["activeDeadlineSeconds"], "activeDeadlineSeconds", minimum=1e-9)
        ),
        env=_env(data.get("env"), "env"),
        setup=_command(data["setup"], "setup") if data.get("setup") else (),
        working_dir=_str(data.get("workingDir", ""), "workingDir"),
        placement=_placement(data.get("placement", "spread")),
        image=_str(data.get("image", ""), "image"),
        namespace=_str(data.get("namespace", "default"), "namespace"),
        annotations=_env(data.get("annotations"), "annotations", check_names=False),
        queue=_queue(data.get("queue", "")),
        priority=_priority(data.get("priority", 0)),
    )
    _check_framework_rules(spec)
    return spec


def _parse_role(name: str, data: Any) -> RoleSpec:
    path = f"roles.{name}"
    if not isinstance(data, Mapping):
        raise SpecError(path, "must be a mapping with replicas, command, and optionally env and gpu")
    _no_unknown(data, _ROLE_KEYS, path)
    if "command" not in data:
        raise SpecError(f"{path}.command", "is missing: give the command to run, e.g. [python, train.py]")
    if "restartPolicy" in data:
        raise SpecError(f"{path}.restartPolicy", "is set for the whole job: move it to the top level")
    cpu, memory = _resources(data.get("resources"), f"{path}.resources")
    return RoleSpec(
        name=name,
        replicas=_int(data.get("replicas", 1), f"{path}.replicas", minimum=1),
        command=_command(data["command"], f"{path}.command"),
        env=_env(data.get("env"), f"{path}.env"),
        gpu=_gpu(data.get("gpu"), f"{path}.gpu"),
        image=_str(data.get("image", ""), f"{path}.image"),
        cpu=cpu,
        memory_mib=memory,
    )


def _resources(data: Any, path: str) -> Tuple[str, Optional[int]]:
    """`resources: {cpu: 2, memory: 8Gi}` per replica (host memory; a bare number is MiB)."""
    if data is None:
        return "", None
    if not isinstance(data, Mapping):
        raise SpecError(path, "must be a mapping such as {cpu: 2, memory: 8Gi}")
    _no_unknown(data, _RESOURCE_KEYS, path)
    cpu = ""
    if data.get("cpu") is not None:
        cpu = str(data["cpu"]).strip()
        if isinstance(data["cpu"], bool) or not _CPU_RE.match(cpu) or float(cpu.rstrip("m") or 0) <= 0:
            raise SpecError(
                f"{path}.cpu", f"{data['cpu']!r} is not a cpu amount: use cores (2, 0.5) or millicores (500m)"
            )
    memory = None
    if data.get("memory") is not None:
        try:
            memory = parse_memory_mib(data["memory"], f"{path}.memory")
        except GpupoolError as err:
            raise SpecError(path, err.message) from None
    return cpu, memory


def roles_without_image(spec: JobSpec) -> List[str]:
    """Roles that name no image, neither their own nor the job's."""
    return [] if spec.image else [r.name for r in spec.roles if not r.image]


def _gpu(data: Any, path: str) -> Optional[GpuRequest]:
    """`gpu: {count: 1, fraction: 0.5}` or `{count: 2, memory: 8Gi}`; a bare number is a fraction of one GPU."""
    if data is None or data is False or data == 0:
        return None
    if isinstance(data, (int, float, str)) and not isinstance(data, bool):
        data = {"fraction": data}
    if not isinstance(data, Mapping):
        raise SpecError(path, "must be a mapping such as {count: 1, fraction: 0.5} or {count: 1, memory: 8Gi}")
    _no_unknown(data, _GPU_KEYS, path)
    if "count" in data and "amount" in data:
        raise SpecError(path, "give count or amount (the same thing), not both")
    count = _int(data.get("count", data.get("amount", 1)), f"{path}.count", minimum=1)
    has_fraction, has_memory = data.get("fraction") is not None, data.get("memory") is not None
    if has_fraction == has_memory:
        raise SpecError(
            path,
            ("give fraction or memory, not both" if has_fraction else "give fraction (e.g. 0.5) or memory (e.g. 8Gi)")
            + " per GPU",
        )
    try:
        fraction = parse_fraction(data["fraction"], f"{path}.fraction") if has_fraction else None
        memory = parse_memory_mib(data["memory"], f"{path}.memory") if has_memory else None
        filters = data.get("filters") or []
        if isinstance(filters, str):
            filters = [filters]
        if not isinstance(filters, list):
            raise SpecError(f"{path}.filters", "must be a list such as ['device.name=*A100*']")
        return GpuRequest(count, fraction, memory, tuple(Filter.parse(str(f)) for f in filters))
    except SpecError:
        raise
    except GpupoolError as err:
        raise SpecError(path, err.message) from None


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


def _no_unknown(data: Mapping[str, Any], known: Set[str], path: str) -> None:
    for key in data:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            raise SpecError(where, f"unknown field: use one of {', '.join(sorted(known))}")


def _enum(cls: Any, value: Any, path: str) -> Any:
    for member in cls:
        if str(value) == member.value or str(value).lower() == member.value.lower():
            return member
    raise SpecError(path, f"{value!r} is not one of {', '.join(m.value for m in cls)}")


def _int(value: Any, path: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(path, f"{value!r} must be a whole number >= {minimum}")
    return value


def _number(value: Any, path: str, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise SpecError(path, f"{value!r} must be a number >= {minimum:g}")
    return float(value)


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise SpecError(path, f"{value!r} must be a string")
    return value


def _command(value: Any, path: str) -> Tuple[str, ...]:
    """A list of arguments, or one string split like a shell would (no shell runs it)."""
    if isinstance(value, str):
        try:
            parts: List[str] = shlex.split(value)
        except ValueError as err:
            raise SpecError(path, f"cannot split {value!r}: {err}") from None
    elif isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        parts = [str(v) for v in value]
    else:
        raise SpecError(path, "must be a list of strings such as [python, train.py, --epochs, '3']")
    if not parts:
        raise SpecError(path, "is empty: give the program to run")
    return tuple(parts)


def _env(value: Any, path: str, check_names: bool = True) -> Tuple[Tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise SpecError(path, "must be a mapping of NAME: value")
    out = []
    for key, val in value.items():
        if check_names and not _ENV_RE.match(str(key)):
            raise SpecError(f"{path}.{key}", "is not a valid environment variable name (letters, digits, _)")
        if isinstance(val, (dict, list)) or val is None:
            raise SpecError(f"{path}.{key}", f"{val!r} must be a string or a number")
        out.append((str(key), str(val).lower() if isinstance(val, bool) else str(val)))
    return tuple(out)


def _queue(value: Any) -> str:
    from ..core.model import check_queue_name

    if value == "":
        return ""
    try:
        return check_queue_name(value)
    except GpupoolError as err:
        raise SpecError("queue", err.message) from None


def _priority(value: Any) -> int:
    from ..core.model import MAX_PRIORITY

    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise SpecError("priority", f"{value!r} must be a whole number from {-MAX_PRIORITY} to {MAX_PRIORITY}")
    return value


def _placement(value: Any) -> Policy:
    try:
        return Policy.parse(value)
    except GpupoolError as err:
        raise SpecError("placement", err.message) from None


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
    return data
