"""The OpenAPI document's bodies and answers: every component is a pydantic model's JSON schema.

Request bodies are `models` (the server validates with them); the answers below are written as
models too, for the document only (the server answers with the core types' `to_dict`, the one
wire format of HTTP and SQLite). `component_schemas` generates the components from all of them,
`OPERATIONS` lists the statuses each operation can answer; `app._openapi` applies both, with the
bearer scheme only when the server runs with auth.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, List, Literal, Optional, Tuple, Type

from pydantic import BaseModel, Field
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, models_json_schema
from pydantic_core import core_schema

from ...core import operations as ops
from ...core.model import LEASE_STATES, RUNNING
from ...core.queues import USAGE_KEYS
from ...core.status import WAIT_REASONS
from .models import (
    REQUESTS,
    Pid,
)
from .wire import MAX_BODY_BYTES

REF = "#/components/schemas/{model}"


# --- answers ------------------------------------------------------------------------------
class HolderBody(BaseModel):
    name: str
    pid: Pid
    host: str
    label: str


class SliceBody(BaseModel):
    uuid: str
    memory_mib: int
    group: int


class AttestBody(BaseModel):
    """In a claim's answer only: the lease's key and the node's attestation socket, where the
    claimant proves its pid (gpupool run does)."""

    key: str
    socket: str


class ParkedSliceBody(BaseModel):
    uuid: str
    memory_mib: int
    group: int = 0
    model: str = ""


class SuspensionBody(BaseModel):
    state: Literal[LEASE_STATES]  # type: ignore[valid-type]
    by: str
    reason: str
    since: float
    want_resume: bool
    parked: List[ParkedSliceBody]
    remap: Dict[str, str] = Field(description="old GPU UUID -> new GPU UUID, while it resumes elsewhere")
    host_bytes: int = Field(description="what its node parked in host memory")
    error: str = Field(description="the last suspend or restore that failed")
    suspended_s: float
    ticket: Optional[int] = None
    mode: str = Field("", description="the preemption mode applied to it, '' = not preempted")


class LeaseBody(BaseModel):
    id: str
    holder: HolderBody
    devices: List[SliceBody]
    ttl_s: float
    created_at: float
    expires_at: float
    queue: str = ""
    priority: int = 0
    preempt_grace_s: float = 0.0
    preempted_at: Optional[float] = Field(None, description="when the pool told it to stop")
    state: Literal[LEASE_STATES] = RUNNING  # type: ignore[valid-type]
    suspension: Optional[SuspensionBody] = None
    idle_suspend_s: Optional[float] = Field(None, description="its claim's idle limit; null: the server's")
    attest: Optional[AttestBody] = None


class LeaseList(BaseModel):
    leases: List[LeaseBody]


class Released(BaseModel):
    released: str


class DeviceBody(BaseModel):
    uuid: str
    index: int
    name: str
    memory_mib: int
    node: str
    healthy: bool
    allocated_mib: int


class DeviceList(BaseModel):
    devices: List[DeviceBody]


class IsolationBody(BaseModel):
    mode: str
    mps_pipe_dir: str = ""
    mps_log_dir: str = ""


class QueueBody(BaseModel):
    name: str
    quota: float
    weight: float
    limit: Optional[float]
    preempt: str = Field("", description="what preempting its borrowers does; '' = the pool's --preempt")
    idle_suspend_s: Optional[float] = Field(None, description="its leases' idle limit; null: the server's")
    default_time_s: Optional[float] = Field(None, description="its runs' wall-time limit without --time; null: none")
    max_time_s: Optional[float] = Field(None, description="the most --time its runs may ask; null: no maximum")
    allocated: float
    borrowed: float
    waiting: int
    preemptions: int = Field(description="its leases preempted ever, in every mode")
    preempted: Dict[str, int] = Field(
        default_factory=dict, description="of those, how many per mode: suspend, requeue, kill"
    )
    preempt_in_force: str = Field("", description="the mode its borrowers are preempted by: its own, else the pool's")


WAIT_KINDS = ("", *WAIT_REASONS)  # '' from a server that does not say


class WaitingBody(BaseModel):
    position: int = Field(description="its place in the order the pool grants them; 0: held")
    ticket: int
    queue: str
    priority: int
    claim: str
    holder: str
    label: str
    queued_at: float
    reason: str = Field(description="why it waits: in /v1/status as the pool last told it, in /v1/queue now")
    held: bool = Field(False, description="kept in the queue, skipped by grants until released")
    why: Literal[WAIT_KINDS] = Field("", description="the kind of reason")  # type: ignore[valid-type]


class WaitingList(BaseModel):
    waiting: List[WaitingBody] = Field(description="in the order the pool grants them; held claims (position 0) last")


class LeaseRecordBody(BaseModel):
    lease: str
    holder: str
    label: str
    queue: str
    gpus: float = Field(description="its share in GPUs")
    started_at: float
    ended_at: float
    elapsed_s: float
    suspended_s: float = Field(description="of its span, parked in host memory (not GPU time)")
    gpu_seconds: float
    ended: str = Field(description="released, expired, preempted or revoked (its token)")
    exit_code: Optional[int] = Field(None, description="its command's, as its runner said at release; null: not said")
    ended_by: str = Field("", description="who ended it: owner or admin; '' = nobody (an expiry) or not recorded")
    preempted: str = Field("", description="how it was last preempted: suspend, requeue or kill; '' = never")
    state: str = Field("", description="as sacct says it: `ended`, or preempted/suspended (requeued, killed)")


class HistoryBody(BaseModel):
    since: float
    until: float
    leases: List[LeaseRecordBody]


class PoolStatusBody(BaseModel):
    devices: List[DeviceBody]
    leases: List[LeaseBody]
    queued: int = Field(ge=0)
    node: str
    isolation: IsolationBody
    usage: Optional[Dict[str, Any]] = Field(description="the watchdog's last sample")
    problems: List[str] = Field(description="leases on GPUs gone or too small")
    queues: List[QueueBody] = []
    waiting: List[WaitingBody] = []


class QueueList(BaseModel):
    queues: List[QueueBody]


class QueueDeleted(BaseModel):
    deleted: str


class UsageRow(BaseModel):
    key: str
    gpu_seconds: float
    gpu_hours: float
    leases: int


class UsageBody(BaseModel):
    since: float
    until: float
    by: Literal[USAGE_KEYS]  # type: ignore[valid-type]  # the one list of keys, spelled once in core.queues
    usage: List[UsageRow]


class TokenBody(BaseModel):
    name: str
    token: str


class TokenInfoBody(BaseModel):
    name: str
    admin: bool
    origin: str = Field(description="api, local, secret or legacy: who made it")
    queue: str
    created_at: float
    last_used: Optional[float] = Field(description="when it last authenticated, to the minute; null: never")


class TokenList(BaseModel):
    tokens: List[TokenInfoBody]


class Revoked(BaseModel):
    revoked: str


class DoctorProblem(BaseModel):
    kind: str
    message: str


class DoctorReport(BaseModel):
    db: str
    healthy: bool
    verdict: str
    problems: List[DoctorProblem]
    devices: int
    leases: int
    tickets: int


class Health(BaseModel):
    status: Literal["ok"]


class ErrorDetail(BaseModel):
    code: str
    message: str
    request_id: str = Field("", description="in a 500 only: the server's log has it with the details")


class ErrorBody(BaseModel):
    error: ErrorDetail


ANSWERS: Tuple[Type[BaseModel], ...] = (
    LeaseBody,
    LeaseList,
    Released,
    DeviceList,
    PoolStatusBody,
    QueueList,
    QueueDeleted,
    WaitingBody,
    WaitingList,
    UsageBody,
    HistoryBody,
    TokenBody,
    TokenList,
    Revoked,
    DoctorReport,
    Health,
    ErrorBody,
)


class _OpenApiSchema(GenerateJsonSchema):
    """Pydantic's JSON schema, as an OpenAPI 3.1 document writes it: an optional value is
    {"type": [T, "null"]} with its limits beside (not anyOf), and no generated titles."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        inner = self.generate_inner(schema["schema"])
        if isinstance(inner.get("type"), str) and not {"enum", "const"} & set(inner):
            return {**inner, "type": [inner["type"], "null"]}
        return super().nullable_schema(schema)

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


@lru_cache(maxsize=1)
def component_schemas() -> Dict[str, Any]:
    """Every body of the API as an OpenAPI (JSON Schema 2020-12) component schema, by model name."""
    models = [(model, "validation") for model in REQUESTS] + [(model, "serialization") for model in ANSWERS]
    _, document = models_json_schema(models, ref_template=REF, schema_generator=_OpenApiSchema)  # type: ignore[arg-type]
    schemas: Dict[str, Any] = document["$defs"]
    for schema in schemas.values():
        schema.pop("title", None)  # the component's name says it
    return schemas


TEXT = "text"  # the Prometheus text format instead of a JSON schema
# (path, method) -> (success status, its schema, error statuses it may answer). Errors 401 and
# the 403s of auth are dropped when the server runs without auth (see `responses`).
OPERATIONS: Dict[Tuple[str, str], Tuple[int, str, Tuple[int, ...]]] = {
    # the pool's operations, as their entries of the operation table say
    **{(op.path, op.method.lower()): (op.status, op.answer, op.errors) for op in ops.OPERATIONS},
    # the probes'
    ("/healthz", "get"): (200, "Health", ()),
    ("/metrics", "get"): (200, TEXT, ()),
}
# Operations that answer 403 without auth too (a server without auth mints no tokens).
_FORBIDDEN_WITHOUT_AUTH = {(op.path, op.method.lower()) for op in ops.OPERATIONS if op.who == ops.MINTER}
REQUEST_BODIES = {
    **{(op.path, op.method.lower()): op.request for op in ops.OPERATIONS if op.request},
}
_DESCRIPTIONS = {
    400: "bad input (not JSON, nested too deeply, a field of the wrong kind)",
    401: "no token, or one this pool does not honour",
    403: "the token may not do this (an admin's call, a lease of another, a queue its token is not bound to)",
    404: "no such lease, queue or waiting claim",
    409: "no room now, and the wait ran out",
    413: f"the body is over {MAX_BODY_BYTES} bytes",
    415: "a server without auth takes changes with Content-Type: application/json only",
    422: "a claim that can never be valid or never fit",
    503: "the pool's database cannot be used (damaged, read-only, disk full)",
}


def responses(path: str, method: str, auth: bool) -> Dict[str, Any]:
    """The exact `responses` of one operation of `OPERATIONS`."""
    success, schema, errors = OPERATIONS[(path, method)]
    content = (
        {"text/plain": {"schema": {"type": "string"}}}
        if schema == TEXT
        else {"application/json": {"schema": ref(schema)}}
    )
    answers: Dict[str, Any] = {str(success): {"description": "success", "content": content}}
    for status in errors:
        if not auth and (status == 401 or (status == 403 and (path, method) not in _FORBIDDEN_WITHOUT_AUTH)):
            continue
        answers[str(status)] = {
            "description": _DESCRIPTIONS[status],
            "content": {"application/json": {"schema": ref("ErrorBody")}},
        }
    if not auth and method in ("post", "put", "patch", "delete"):  # server.localonly's rule
        answers["415"] = {
            "description": _DESCRIPTIONS[415],
            "content": {"application/json": {"schema": ref("ErrorBody")}},
        }
    return answers


def ref(name: str) -> Dict[str, str]:
    return {"$ref": REF.format(model=name)}


def request_body(name: str) -> Dict[str, Any]:
    """The `requestBody` of an operation whose JSON body (schema `name`) we parse ourselves; one
    whose fields all have defaults may be left out (json_object reads no body as {})."""
    model = next(m for m in REQUESTS if m.__name__ == name)
    required = any(field.is_required() for field in model.model_fields.values())
    return {"required": required, "content": {"application/json": {"schema": ref(name)}}}


__all__: List[str] = [
    "component_schemas",
    "OPERATIONS",
    "responses",
    "request_body",
    "REQUEST_BODIES",
    "LeaseBody",
    "ErrorBody",
]
