"""The request bodies of the API as pydantic models: the one statement of what a claim, a token
request and a queue request may hold.

Each rule is written once, here, with its limit from the core constants; the OpenAPI document's
components are these models' JSON schemas (`schemas.component_schemas`), and both roads that
answer a claim (the routes and `fastpath`) validate with them through `LeaseApi.claim`. Every
model is strict: a "12" is not a pid, a true is not a number, NaN is not a second. A body the
model refuses is one line naming the field, the value, the rule and an example (`validated`).
The core types (`core.model.Claim`, `Holder`) are built from a valid model and check their own
invariants again: the embedded pool and the store never pass through HTTP.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple, Type, TypeVar, Union, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from ...core.errors import InvalidInput
from ...core.filters import Filter
from ...core.model import (
    MAX_EXIT_CODE,
    MAX_GPUS_PER_REQUEST,
    MAX_IDLE_SUSPEND_S,
    MAX_LABEL_CHARS,
    MAX_PREEMPT_GRACE_S,
    MAX_PRIORITY,
    MAX_REQUESTS_PER_CLAIM,
    MAX_TIME_LIMIT_S,
    MAX_TTL_S,
    MAX_WAIT_S,
    MIN_FRACTION,
    MIN_IDLE_SUSPEND_S,
    MIN_TIME_LIMIT_S,
    MIN_TTL_S,
    PID_MAX,
    QUEUE_NAME_RE,
    Claim,
    GpuRequest,
    Holder,
    Policy,
    prechecked,
)
from ...core.outage import KEY_PATTERN
from ...core.queues import MAX_QUEUE_GPUS, MAX_WEIGHT
from ...core.suspension import MAX_ERROR_CHARS, PREEMPT_MODES
from .auth import ADMIN_NAME, NAME_PATTERN

# The filters a claim sends, in the form `Filter.to_text` writes (`gpupool run --filter` also
# reads looser text: spaces, upper-case keys): name, uuid and server.addr by '=' with globs,
# index by a whole number, memory by a size (core.quantity checks the size).
FILTER_PATTERN = (
    r"^((device\.(name|uuid)|server\.addr)=\S(.*\S)?|device\.index(=|>=|<=)[0-9]+|device\.memory(=|>=|<=)\S+)$"
)
QUEUE_PATTERN = f"^({QUEUE_NAME_RE.pattern})?$"  # "" = no queue
# A share is exactly one of these per GPU request: the model's check and the schema's oneOf.
SHARE_FIELDS = {"fraction": "number", "memory_mib": "integer"}
# Core's rounding rule, said where the API documents a fraction (GpuRequest.memory_on).
ROUNDING = (GpuRequest.memory_on.__doc__ or "").split("\n", 1)[0].split(": ", 1)[-1]

DEFAULT_POLICY = cast(Policy, Claim.__dataclass_fields__["policy"].default)  # what a claim without one gets
# A valid value of a field, said in the document and in each refusal of the field. An OpenAPI
# extension rather than JSON Schema's `examples`: fuzzers and UIs send those as they are (a claim
# with wait_s 60 on a full pool waits).
EXAMPLE = "x-example"


def example(value: Any) -> Dict[str, Any]:
    """The `json_schema_extra` of a field whose valid example is `value`."""
    return {EXAMPLE: value}


Pid = Annotated[int, Field(ge=0, le=PID_MAX, description="the claimant's process id, a label; 0: none")]


class _Body(BaseModel):
    # Strict: JSON's kinds as they are, no coercion; NaN and infinities are no numbers.
    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class GpuRequestBody(_Body):
    """N distinct GPUs, each with exactly one of fraction or memory_mib."""

    model_config = ConfigDict(
        json_schema_extra={
            # exactly one of the two is a number (the other absent or null)
            "oneOf": [{"required": [name], "properties": {name: {"type": kind}}} for name, kind in SHARE_FIELDS.items()]
        }
    )

    count: int = Field(1, ge=1, le=MAX_GPUS_PER_REQUEST, description="distinct GPUs", json_schema_extra=example(1))
    fraction: Optional[float] = Field(
        None,
        ge=MIN_FRACTION,
        le=1,
        description=f"share of each GPU's memory; the MiB granted: {ROUNDING}",
        json_schema_extra=example(0.5),
    )
    memory_mib: Optional[int] = Field(None, ge=1, description="MiB of each GPU", json_schema_extra=example(8192))
    filters: Optional[List[Annotated[str, Field(pattern=FILTER_PATTERN)]]] = Field(
        None, json_schema_extra=example(["device.name=*A100*", "device.memory>=16384"])
    )

    @model_validator(mode="after")
    def _one_share(self) -> GpuRequestBody:
        if (self.fraction is None) == (self.memory_mib is None):
            raise PydanticCustomError(
                "one_share",
                "must have exactly one of fraction (e.g. 0.5) or memory_mib (e.g. 8192); it has {which}",
                {"which": "neither" if self.fraction is None else "both"},
            )
        return self

    def to_core(self) -> GpuRequest:
        filters = tuple(Filter.parse(text) for text in self.filters or ())
        # The rules of GpuRequest are this model's: checked once (prechecked), by pydantic.
        return prechecked(
            GpuRequest, count=self.count, fraction=self.fraction, memory_mib=self.memory_mib, filters=filters
        )


class ClaimBody(_Body):
    """What to claim: GPU requests granted together, where to queue, how to be preempted."""

    requests: List[GpuRequestBody] = Field(
        min_length=1,
        max_length=MAX_REQUESTS_PER_CLAIM,
        description="granted all together or not at all (a gang: one per replica)",
        json_schema_extra=example([{"count": 1, "fraction": 0.5}]),
    )
    # Not strict: the JSON text "binpack" is the enum's value (strict takes Policy members only).
    policy: Annotated[Policy, Strict(False)] = DEFAULT_POLICY
    queue: str = Field(
        "",
        pattern=QUEUE_PATTERN,
        description="the queue (GET /v1/queues); a token bound to a queue claims in it only",
        json_schema_extra=example("team-a"),
    )
    priority: int = Field(
        0, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="higher first inside the queue", json_schema_extra=example(10)
    )
    preempt_grace_s: Optional[float] = Field(
        None,
        ge=0,
        le=MAX_PREEMPT_GRACE_S,
        description="seconds between SIGTERM and SIGKILL when preempted (default: the server's)",
        json_schema_extra=example(30),
    )

    idle_suspend_s: Optional[float] = Field(
        None,
        ge=MIN_IDLE_SUSPEND_S,
        le=MAX_IDLE_SUSPEND_S,
        description="suspend the lease once its processes kept its GPUs 0 % busy this long (default: the server's)",
        json_schema_extra=example(600),
    )

    def to_core(self) -> Claim:
        requests = tuple(request.to_core() for request in self.requests)
        return prechecked(
            Claim,
            requests=requests,
            policy=self.policy,
            queue=self.queue,
            priority=self.priority,
            preempt_grace_s=self.preempt_grace_s,
            idle_suspend_s=self.idle_suspend_s,
        )


class HolderRequest(_Body):
    """Who claims: labels for people (name is the token's when auth is on), never an input to a kill."""

    name: Optional[str] = Field(None, max_length=MAX_LABEL_CHARS)
    pid: Optional[Pid] = Field(None, json_schema_extra=example(4242))
    host: Optional[str] = Field(None, max_length=MAX_LABEL_CHARS)
    label: Optional[str] = Field(None, max_length=MAX_LABEL_CHARS, json_schema_extra=example("pod:ml/trainer-0:1b2c"))

    def to_core(self) -> Holder:
        return Holder(self.name or "", self.pid or 0, self.host or "", self.label or "")


class ClaimRequest(_Body):
    """The body of POST /v1/leases."""

    # python-re: the key's pattern looks ahead (ECMA and Python regexes can, the default engine cannot)
    model_config = ConfigDict(extra="forbid", regex_engine="python-re")

    claim: ClaimBody = Field(json_schema_extra=example({"requests": [{"count": 1, "fraction": 0.5}]}))
    holder: Optional[HolderRequest] = None
    wait_s: Optional[float] = Field(
        0.0,
        ge=0,
        le=MAX_WAIT_S,
        description="seconds to wait in the FIFO queue; 0 fails at once",
        json_schema_extra=example(60),
    )
    ttl_s: Optional[float] = Field(
        None,
        ge=MIN_TTL_S,
        le=MAX_TTL_S,
        description="the lease expires this long after the last heartbeat (default: the server's)",
        json_schema_extra=example(30),
    )
    key: Optional[str] = Field(
        None,
        pattern=KEY_PATTERN,
        description="a random id the client picks for this claim and sends with each try of it: "
        "a retry (the answer was lost, the server restarted) gets the lease granted to it, "
        "or its place in the queue back",
        json_schema_extra=example("0f8e4c2a9b7d4e1f8a3c6b5d2e9f7a10"),
    )


class TokenRequest(_Body):
    """The body of POST /v1/tokens: create or rotate a named token."""

    model_config = ConfigDict(
        extra="forbid",
        # an admin token acts on every lease: it is bound to no queue
        json_schema_extra={
            "not": {
                "required": ["admin", "queue"],
                "properties": {"admin": {"const": True}, "queue": {"type": "string", "minLength": 1}},
            }
        },
    )

    name: str = Field(pattern=NAME_PATTERN, json_schema_extra={"not": {"const": ADMIN_NAME}, **example("alice")})
    admin: bool = False
    replace: bool = Field(
        False, description="replace a token of that name (it stops working); else an existing name is refused"
    )
    queue: Optional[str] = Field(
        None,
        pattern=QUEUE_PATTERN,
        description="the one queue (it must exist) its claims may use",
        json_schema_extra=example("team-a"),
    )

    @field_validator("name")
    @classmethod
    def _not_admin(cls, name: str) -> str:
        if name == ADMIN_NAME:  # the schema's "not": the server's own token has this name
            raise PydanticCustomError("reserved", "is the server's own token's name: choose another")
        return name

    @model_validator(mode="after")
    def _admin_in_no_queue(self) -> TokenRequest:
        if self.admin and self.queue:
            raise PydanticCustomError(
                "admin_queue", "an admin token is bound to no queue (it may act on every lease): drop admin or queue"
            )
        return self


PREEMPT_MODES_OR_DEFAULT = ("", *PREEMPT_MODES)
# A runner's error report is kept as one line of MAX_ERROR_CHARS; a longer one is cut, not refused.
MAX_REPORT_CHARS = 4 * MAX_ERROR_CHARS
MAX_HOST_BYTES = 1 << 50  # 1 PiB: more host memory than any node has


class QueueRequest(_Body):
    """The body of PUT /v1/queues/{name} (the path names the queue)."""

    model_config = ConfigDict(extra="forbid")

    quota: float = Field(
        ge=0, le=MAX_QUEUE_GPUS, description="GPUs guaranteed (1.5 = 1.5 GPUs' worth)", json_schema_extra=example(1.5)
    )
    weight: Optional[float] = Field(1.0, gt=0, le=MAX_WEIGHT, json_schema_extra=example(2))
    limit: Optional[float] = Field(
        None, ge=0, le=MAX_QUEUE_GPUS, description="GPUs at most, borrowing included", json_schema_extra=example(4)
    )
    idle_suspend_s: Optional[float] = Field(
        None,
        ge=MIN_IDLE_SUSPEND_S,
        le=MAX_IDLE_SUSPEND_S,
        description="suspend its leases once idle this long (a claim's own limit wins); null: the server's",
        json_schema_extra=example(1800),
    )
    default_time_s: Optional[float] = Field(
        None,
        ge=MIN_TIME_LIMIT_S,
        le=MAX_TIME_LIMIT_S,
        description="wall-time limit of its runs without --time (as Slurm's DefaultTime); null: none",
        json_schema_extra=example(3600),
    )
    max_time_s: Optional[float] = Field(
        None,
        ge=MIN_TIME_LIMIT_S,
        le=MAX_TIME_LIMIT_S,
        description="the most --time its runs may ask (as Slurm's MaxTime); null: no maximum",
        json_schema_extra=example(86400),
    )
    preempt: Literal[PREEMPT_MODES_OR_DEFAULT] = Field(  # type: ignore[valid-type]
        "",
        description="what preempting its borrowers does; '' = the pool's --preempt",
        json_schema_extra=example("suspend"),
    )


class SuspendRequest(_Body):
    """The body of POST /v1/leases/{id}/suspend."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        "", max_length=MAX_ERROR_CHARS, description="for people: why", json_schema_extra=example("a demo")
    )


class ResumeRequest(_Body):
    """The body of POST /v1/leases/{id}/resume: nothing (an empty object)."""

    model_config = ConfigDict(extra="forbid")


class RestoredReport(_Body):
    """The runner's word on a resume (POST /v1/leases/{id}/restored): '' = restored."""

    model_config = ConfigDict(extra="forbid")

    error: str = Field("", max_length=MAX_REPORT_CHARS, description="why the restore failed; '' = it worked")


class ParkedReport(RestoredReport):
    """The runner's word on a suspend (POST /v1/leases/{id}/parked): '' = parked."""

    host_bytes: int = Field(0, ge=0, le=MAX_HOST_BYTES, description="GPU memory parked in host memory, bytes")


class ReleaseRequest(_Body):
    """The body of DELETE /v1/leases/{id} (optional: no body says nothing)."""

    model_config = ConfigDict(extra="forbid")

    exit_code: Optional[int] = Field(
        None,
        ge=0,
        le=MAX_EXIT_CODE,
        description="its command's exit code, as the runner says: kept in the lease history as given (a label)",
        json_schema_extra=example(0),
    )
    timed_out: Optional[bool] = Field(
        None,
        description="the runner ended the command at its time limit (gpupool run --time): the history says timeout",
        json_schema_extra=example(False),
    )


class HoldRequest(_Body):
    """The body of POST /v1/claims/{id}/hold, /release and /cancel: nothing (an empty object)."""

    model_config = ConfigDict(extra="forbid")


class PriorityRequest(_Body):
    """The body of PUT /v1/claims/{id}/priority: the waiting claim's new priority."""

    model_config = ConfigDict(extra="forbid")

    priority: int = Field(
        ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="higher first inside its queue", json_schema_extra=example(10)
    )


REQUESTS: Tuple[Type[BaseModel], ...] = (
    ClaimRequest,
    TokenRequest,
    QueueRequest,
    SuspendRequest,
    ResumeRequest,
    ParkedReport,
    RestoredReport,
    ReleaseRequest,
    HoldRequest,
    PriorityRequest,
)
Model = TypeVar("Model", bound=BaseModel)


def validated(model: Type[Model], body: Dict[str, Any], error: Type[InvalidInput] = InvalidInput) -> Model:
    """`body` as `model`, or `error` with one line: the field, the value, the rule, an example."""
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise error(explain(model, err)) from None


def explain(model: Type[BaseModel], err: ValidationError) -> str:
    """One line for the first problem of `err` (and how many more there are)."""
    problems = err.errors(include_url=False)
    first = problems[0]
    loc, kind, ctx = first["loc"], first["type"], first.get("ctx") or {}
    where = path(loc)
    if kind == "extra_forbidden":
        owner = _model_at(model, loc[:-1])
        message = f"unknown field {loc[-1]!r}: the fields are {', '.join(owner.model_fields) if owner else '?'}"
    else:  # ours (custom kinds) say the rule in their message; pydantic's, the table
        rule = _RULES[kind].format(**ctx) if kind in _RULES else first["msg"]
        if kind in _RANGE:
            rule = _range(model, loc) or rule
        shown = "" if kind in _NO_VALUE else f" {_shown(first.get('input'))}"
        message = f"{where}{shown} {rule}" if where else rule
    info = _field_at(model, loc)
    extra = info.json_schema_extra if info is not None else None
    if kind not in ("extra_forbidden", "one_share") and isinstance(extra, dict) and EXAMPLE in extra:
        message += f": e.g. {json.dumps(extra[EXAMPLE])}"
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} more)"
    return message


def path(loc: Tuple[Union[int, str], ...]) -> str:
    """('claim', 'requests', 0, 'count') -> 'claim.requests[0].count'."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_RULES = {
    "missing": "is missing",
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
    "finite_number": "must be a finite number",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be above {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be below {lt}",
    "too_short": "needs at least {min_length} item(s)",
    "too_long": "has {actual_length} items, over the limit of {max_length}",
    "string_too_long": "is over {max_length} characters: shorten it",
    "string_pattern_mismatch": "does not match {pattern}",
    "enum": "must be one of {expected}",
}
# The value says nothing more, or is long (30,000 requests, a whole GPU request).
_NO_VALUE = {"missing", "too_short", "too_long", "one_share"}


_RANGE = {"greater_than_equal", "greater_than", "less_than_equal", "less_than"}
_BOUNDS = {"minimum": "at least", "exclusiveMinimum": "above", "maximum": "at most", "exclusiveMaximum": "below"}


def _range(model: Type[BaseModel], loc: Tuple[Union[int, str], ...]) -> str:
    """'must be at least 0 and at most 4194304': both ends of a field's range, from its schema."""
    names = [part for part in loc if isinstance(part, str)]
    owner = _model_at(model, loc[: max(i for i, part in enumerate(loc) if isinstance(part, str))]) if names else None
    if owner is None:
        return ""
    field = _schema(owner).get("properties", {}).get(names[-1], {})
    for schema in (field, *field.get("anyOf", ())):  # an Optional field's bounds sit in its anyOf
        ends = [f"{_BOUNDS[key]} {_number(schema[key])}" for key in _BOUNDS if key in schema]
        if ends:
            return "must be " + " and ".join(ends)
    return ""


def _number(value: float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


@cache
def _schema(model: Type[BaseModel]) -> Dict[str, Any]:
    return model.model_json_schema()


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _model_at(model: Type[BaseModel], loc: Tuple[Union[int, str], ...]) -> Optional[Type[BaseModel]]:
    """The model class that holds the fields at `loc` (list indexes skipped)."""
    current: Optional[Type[BaseModel]] = model
    for part in loc:
        if isinstance(part, int):
            continue
        info = current.model_fields.get(part) if current is not None else None
        current = _model_in(info.annotation) if info is not None else None
    return current


def _field_at(model: Type[BaseModel], loc: Tuple[Union[int, str], ...]) -> Optional[FieldInfo]:
    names = [i for i, part in enumerate(loc) if isinstance(part, str)]
    if not names:
        return None
    owner = _model_at(model, loc[: names[-1]])
    return owner.model_fields.get(str(loc[names[-1]])) if owner is not None else None


def _model_in(annotation: Any) -> Optional[Type[BaseModel]]:
    """The model inside an annotation such as Optional[List[GpuRequestBody]]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
