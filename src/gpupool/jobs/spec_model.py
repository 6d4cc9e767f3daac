"""The job spec's YAML layout as pydantic models: the one statement of what each field may hold.

`spec.parse_spec` validates plain data with `JobModel` and builds the frozen `JobSpec` from
it. Every model is strict (a "2" is not a replica count, true is not a number) and closed
(an unknown key is an error). A refusal is one line (`explain`): the field's dotted path
(``roles.worker.gpu.fraction``), the value, the rule and how to fix it. Rules that span
roles (one chief, TensorFlow's roles) are the framework's and stay in `spec`.
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any, Dict, List, NoReturn, Optional, Tuple, Type, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..core.errors import GpupoolError
from ..core.filters import Filter
from ..core.model import MAX_PRIORITY, GpuRequest, Policy, check_queue_name
from ..core.quantity import parse_fraction, parse_memory_mib
from ..train import storage
from .spec import MAX_NAME, Framework, RestartPolicy, SuccessPolicy

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CPU_RE = re.compile(r"^(\d+(\.\d+)?|\d+m)$")
_SECRET_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # a Kubernetes object name (DNS subdomain)
_RULE = "spec_rule"  # the error type of our own rules: their message is the whole rule


def _refuse(rule: str) -> NoReturn:
    # The rule goes in through the context: a literal "{cpu: 2}" in it is not a template field.
    raise PydanticCustomError(_RULE, "{rule}", {"rule": rule})


def _quantity(parse: Any, value: Any, what: str) -> Any:
    """A core.quantity parser's answer, or its message as this field's rule."""
    try:
        return parse(value, what)
    except GpupoolError as err:
        _refuse(err.message)


def _enum_member(cls: Any) -> Any:
    """A before-validator matching an enum's value case-insensitively ("onfailure" is OnFailure)."""

    def match(value: Any) -> Any:
        for member in cls:
            if str(value).lower() == member.value.lower():
                return member
        _refuse(f"{value!r} is not one of {', '.join(m.value for m in cls)}")

    return match


def _job_name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value) or len(value) > MAX_NAME:
        _refuse(
            f"{value!r} is not a valid job name: use lowercase letters, digits and '-', "
            f"starting with a letter, at most {MAX_NAME} characters (e.g. digits-ddp)"
        )
    return value


def _command(value: Any) -> Tuple[str, ...]:
    """A list of arguments, or one string split like a shell would (no shell runs it)."""
    if isinstance(value, str):
        try:
            parts: List[str] = shlex.split(value)
        except ValueError as err:
            _refuse(f"cannot split {value!r}: {err}")
    elif isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        parts = [str(v) for v in value]
    else:
        _refuse(f"{value!r} must be a list of strings such as [python, train.py, --epochs, '3']")
    if not parts:
        _refuse("is empty: give the program to run")
    return tuple(parts)


def _env_name(value: str) -> str:
    if not _ENV_RE.match(value):
        _refuse("is not a valid environment variable name (letters, digits, _)")
    return value


def _env_value(value: Any) -> str:
    if isinstance(value, (dict, list)) or value is None:
        _refuse(f"{value!r} must be a string or a number")
    return str(value).lower() if isinstance(value, bool) else str(value)


def _queue(value: Any) -> str:
    if value == "":
        return ""
    try:
        return check_queue_name(value)
    except GpupoolError as err:
        _refuse(err.message)


def _checkpoints(value: Any) -> str:
    """A bucket URL of a known scheme, or a path; never one carrying credentials or a signature
    (the value goes into every replica's env and the manifests). Messages show it redacted."""
    if not isinstance(value, str):
        _refuse(f"{value!r} must be a URL such as s3://bucket/jobs/NAME, or a path")
    shown = storage.redact(repr(value))
    proto = storage.scheme(value)
    if storage.has_userinfo(value):
        _refuse(
            f"{shown} carries credentials; remove them and name a Secret holding them in storageSecret "
            "(locally the SDK finds them in the environment)"
        )
    signed = storage.secret_query_keys(value)
    if signed:
        _refuse(
            f"{shown} carries a signature or credential ({', '.join(signed)}): a presigned URL is one "
            "object's, for a while; give the bucket's URL, e.g. s3://bucket/jobs/NAME, and the credentials in "
            "storageSecret (locally the SDK finds them in the environment)"
        )
    if proto and proto not in storage.BACKENDS:
        _refuse(f"{shown}: unknown scheme {proto!r}; use s3://, gs://, az:// or file://, or a path")
    return value


def _secret_name(value: Any) -> str:
    if not isinstance(value, str) or (value and (not _SECRET_RE.match(value) or len(value) > 253)):
        _refuse(f"{value!r} is not a Kubernetes Secret name (lowercase letters, digits, '-' and '.')")
    return str(value)


def _placement(value: Any) -> Policy:
    try:
        return Policy.parse(value)
    except GpupoolError as err:
        _refuse(err.message)


# The schema of each field is the form the YAML is written in (documented from it), not the parsed one.
_SIZE = {"anyOf": [{"type": "integer", "description": "MiB"}, {"type": "string", "examples": ["8Gi", "8192Mi"]}]}
_SCALAR = {"type": ["string", "number", "boolean"]}
Command = Annotated[
    Any,
    AfterValidator(_command),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": ["string", "number"]}}]}),
]
EnvValue = Annotated[Any, AfterValidator(_env_value), WithJsonSchema(_SCALAR)]
# `env:` left empty in YAML is null: no variables
Env = Annotated[
    Dict[Annotated[str, AfterValidator(_env_name)], EnvValue], BeforeValidator(lambda v: {} if v is None else v)
]
Count = Annotated[int, Strict(), Field(ge=1)]
Seconds = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)


class GpuModel(_Closed):
    """`gpu: {count: 1, fraction: 0.5}` or `{count: 2, memory: 8Gi}`; a bare number is a fraction."""

    count: Count = 1
    fraction: Annotated[Optional[float], WithJsonSchema({"type": ["number", "string"], "examples": [0.5, "50%"]})] = (
        None
    )
    memory: Annotated[Optional[int], WithJsonSchema(_SIZE)] = None  # MiB
    filters: Annotated[
        Tuple[Filter, ...],
        WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
    ] = ()

    @model_validator(mode="before")
    @classmethod
    def _one_count(cls, data: Any) -> Any:
        if isinstance(data, dict) and "amount" in data:
            if "count" in data:
                _refuse("give count or amount (the same thing), not both")
            data = {("count" if k == "amount" else k): v for k, v in data.items()}
        return data

    @field_validator("fraction", mode="before")
    @classmethod
    def _fraction(cls, value: Any) -> Any:
        return None if value is None else _quantity(parse_fraction, value, "fraction")

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        return None if value is None else _quantity(parse_memory_mib, value, "memory")

    @field_validator("filters", mode="before")
    @classmethod
    def _filters(cls, value: Any) -> Tuple[Filter, ...]:
        value = value or []  # an empty filter list, or an empty string, is none
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list):
            _refuse(f"{value!r} must be a list such as ['device.name=*A100*']")
        return tuple(_quantity(lambda text, _: Filter.parse(text), str(f), "filter") for f in value)

    @model_validator(mode="after")
    def _one_share(self) -> GpuModel:
        if (self.fraction is None) == (self.memory is None):
            given = self.fraction is not None
            _refuse(
                ("give fraction or memory, not both" if given else "give fraction (e.g. 0.5) or memory (e.g. 8Gi)")
                + " per GPU"
            )
        _quantity(lambda model, _: model.request(), self, "gpu")  # core's own limits (GPUs per request ...)
        return self

    def request(self) -> GpuRequest:
        """The core's request for this share."""
        return GpuRequest(self.count, self.fraction, self.memory, self.filters)


def _gpu_shorthand(value: Any) -> Any:
    """No GPU for null, false or 0; a bare number or "50%" is a fraction of one GPU."""
    if value is None or value is False or value == 0:
        return None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return {"fraction": value}
    return value


def _gpu_schema(schema: Dict[str, Any]) -> None:
    """The gpu field's schema also takes the shorthand `_gpu_shorthand` reads."""
    schema["anyOf"].append({"type": ["number", "string", "boolean"]})


class ResourcesModel(_Closed):
    """`resources: {cpu: 2, memory: 8Gi}` per replica (host memory; a bare number is MiB)."""

    cpu: Annotated[str, WithJsonSchema({"type": ["string", "number"], "examples": [2, "500m"]})] = ""
    memory: Annotated[Optional[int], WithJsonSchema(_SIZE)] = None  # MiB

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any) -> str:
        if value is None:
            return ""
        text = str(value).strip()
        if isinstance(value, bool) or not _CPU_RE.match(text) or float(text.rstrip("m") or 0) <= 0:
            _refuse(f"{value!r} is not a cpu amount: use cores (2, 0.5) or millicores (500m)")
        return text

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        return None if value is None else _quantity(parse_memory_mib, value, "memory")


class RoleModel(_Closed):
    """One role: `replicas` identical processes sharing command, env and GPU share."""

    replicas: Count = 1
    command: Command
    env: Env = {}
    gpu: Annotated[Optional[GpuModel], BeforeValidator(_gpu_shorthand)] = Field(None, json_schema_extra=_gpu_schema)
    image: Annotated[str, Strict()] = ""
    resources: Optional[ResourcesModel] = None
    restart_policy: Annotated[Any, WithJsonSchema({"not": {}})] = Field(
        None, alias="restartPolicy"
    )  # only to say where it belongs

    @field_validator("restart_policy")
    @classmethod
    def _job_level(cls, value: Any) -> Any:
        _refuse("is set for the whole job: move it to the top level")


class JobModel(_Closed):
    """A whole job as its YAML says it: roles plus restart, success and deadline policies."""

    name: Annotated[
        Any,
        AfterValidator(_job_name),
        WithJsonSchema({"type": "string", "pattern": _NAME_RE.pattern, "maxLength": MAX_NAME}),
    ]
    framework: Annotated[Framework, BeforeValidator(_enum_member(Framework))] = Framework.NONE
    roles: Dict[str, RoleModel]
    restart_policy: Annotated[RestartPolicy, BeforeValidator(_enum_member(RestartPolicy))] = Field(
        RestartPolicy.NEVER, alias="restartPolicy"
    )
    backoff_limit: Annotated[int, Strict(), Field(ge=0)] = Field(3, alias="backoffLimit")
    backoff_seconds: Seconds = Field(1.0, alias="backoffSeconds")
    success_policy: Annotated[SuccessPolicy, BeforeValidator(_enum_member(SuccessPolicy))] = Field(
        SuccessPolicy.CHIEF, alias="successPolicy"
    )
    active_deadline_seconds: Optional[Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]] = Field(
        None, alias="activeDeadlineSeconds"
    )
    env: Env = {}
    setup: Optional[Command] = None
    working_dir: Annotated[str, Strict()] = Field("", alias="workingDir")
    placement: Annotated[Policy, BeforeValidator(_placement), WithJsonSchema({"enum": [p.value for p in Policy]})] = (
        Policy.SPREAD
    )
    image: Annotated[str, Strict()] = ""
    namespace: Annotated[str, Strict()] = "default"
    annotations: Annotated[Dict[str, EnvValue], BeforeValidator(lambda v: {} if v is None else v)] = {}
    queue: Annotated[Any, AfterValidator(_queue), WithJsonSchema({"type": "string"})] = ""
    priority: Annotated[int, Strict(), Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = 0
    checkpoints: Annotated[
        Any,
        AfterValidator(_checkpoints),
        WithJsonSchema({"type": "string", "examples": ["s3://bucket/jobs/digits", "gs://bucket/run"]}),
    ] = ""
    storage_secret: Annotated[Any, AfterValidator(_secret_name), WithJsonSchema({"type": "string"})] = Field(
        "", alias="storageSecret"
    )

    @field_validator("roles")
    @classmethod
    def _some_role(cls, value: Dict[str, RoleModel]) -> Dict[str, RoleModel]:
        if not value:
            _refuse(_HINTS["roles"])
        return value

    @field_validator("setup", mode="before")
    @classmethod
    def _no_setup(cls, value: Any) -> Any:
        return value or None  # an empty setup is none


# What to write, per field, when it is missing ...
_HINTS = {
    "name": "give the job a name, e.g. digits-ddp",
    "roles": "give at least one role, e.g. roles: {worker: {replicas: 2, command: [...]}}",
    "command": "give the command to run, e.g. [python, train.py]",
}
# ... and when it is not the mapping it should be.
_SHAPES = {
    "roles": "must be a mapping of role names to roles, e.g. {worker: {replicas: 2, command: [...]}}",
    "gpu": "must be a mapping such as {count: 1, fraction: 0.5} or {count: 1, memory: 8Gi}",
    "resources": "must be a mapping such as {cpu: 2, memory: 8Gi}",
    "env": "must be a mapping of NAME: value",
    "annotations": "must be a mapping of NAME: value",
}
_RULES = {
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
}


def explain(err: ValidationError) -> Tuple[str, str]:
    """(path, message) of the first problem in `err`, naming the value and the fix."""
    problems = err.errors(include_url=False)
    first = problems[0]
    loc, kind, ctx, value = first["loc"], first["type"], first.get("ctx") or {}, first.get("input")
    where = path(loc)
    field = next((str(p) for p in reversed(loc) if isinstance(p, str) and not p.startswith("[")), "")
    if kind == _RULE:
        message = str(ctx["rule"])
    elif kind == "missing":
        message = "is missing" + (f": {_HINTS[field]}" if field in _HINTS else "")
    elif kind == "extra_forbidden":
        owner = _model_at(JobModel, loc[:-1])
        known = sorted(f.alias or name for name, f in owner.model_fields.items()) if owner else []
        known += ["amount"] if owner is GpuModel else []  # count's other name
        message = f"unknown field: use one of {', '.join(sorted(known))}"
    elif kind in ("dict_type", "model_type", "model_attributes_type"):
        message = f"{value!r} {_SHAPES.get(field, 'must be a mapping')}"
    elif kind in _RULES:
        bounds = {k: v for k, v in ctx.items() if isinstance(v, (int, float))}
        rule = _RULES[kind].format(**{k: v if isinstance(v, int) else f"{v:g}" for k, v in bounds.items()})
        whole = bool(bounds) and all(isinstance(v, int) for v in bounds.values())  # an int field's bound
        message = f"{value!r} " + (rule.replace("must be", "must be a whole number") if whole else rule)
    else:
        message = f"{value!r}: {first['msg']}"
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} more)"
    return where, storage.redact(message)  # a URL's password or signature, wherever it was written


def path(loc: Tuple[Union[int, str], ...]) -> str:
    """('roles', 'worker', 'env', '1BAD', '[key]') -> 'roles.worker.env.1BAD'."""
    return ".".join(str(part) for part in loc if not (isinstance(part, str) and part.startswith("[")))


def _model_at(model: Type[BaseModel], loc: Tuple[Union[int, str], ...]) -> Optional[Type[BaseModel]]:
    """The model class validating the mapping at `loc` (dict keys such as role names skipped)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
            if info is None:
                return None
            current = info.annotation
        elif get_origin(current) is dict:
            current = get_args(current)[1]  # the part was a key (a role's name)
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Optional[X] -> X."""
    if get_origin(annotation) is Union:
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation
