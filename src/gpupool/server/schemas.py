"""The exact OpenAPI description of the API: request and response bodies, and each operation's answers.

Requests are parsed by the core model's `from_dict` (one wire format for HTTP and SQLite, one
set of error messages); the JSON schemas here describe that format by hand, so they can say what
pydantic models cannot (exactly one of fraction or memory_mib, the token-name pattern) and every
success answer has its schema. `OPERATIONS` lists the statuses each operation can answer;
`app._openapi` applies it, with the bearer scheme only when the server runs with auth.
The pydantic classes below only give the routes' decorators names to refer to.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from pydantic import BaseModel

from ..core.model import (
    MAX_GPUS_PER_REQUEST,
    MAX_PREEMPT_GRACE_S,
    MAX_PRIORITY,
    MAX_REQUESTS_PER_CLAIM,
    MIN_FRACTION,
    PID_MAX,
    QUEUE_NAME_RE,
    Claim,
    Policy,
)
from ..core.outage import KEY_PATTERN
from ..core.queues import USAGE_KEYS
from ..pool.service import MAX_TTL_S, MAX_WAIT_S, MIN_TTL_S
from .auth import ADMIN_NAME, NAME_PATTERN


class ClaimRequest(BaseModel):
    """Name of the claim request body (its schema is `component_schemas()["ClaimRequest"]`)."""


class TokenRequest(BaseModel):
    """Name of the token request body."""


class QueueRequest(BaseModel):
    """Name of the queue request body (PUT /v1/queues/{name})."""


class LeaseBody(BaseModel):
    """Name of a lease in answers."""


class ErrorBody(BaseModel):
    """Name of the error answer."""


REF = "#/components/schemas/{model}"
DEFAULT_POLICY = Claim.__dataclass_fields__["policy"].default.value  # what a claim without a policy gets


def ref(name: str) -> Dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _object(properties: Dict[str, Any], required: Tuple[str, ...] = (), closed: bool = False) -> Dict[str, Any]:
    schema: Dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


_STR = {"type": "string"}
FILTER_PATTERN = r"^(device\.(name|uuid|index|memory)|server\.addr)(=|>=|<=)\S+$"
_INT = {"type": "integer"}
_NUM = {"type": "number"}


def component_schemas() -> Dict[str, Any]:
    """Every body of the API as an OpenAPI (JSON Schema 2020-12) component schema."""
    pid = {"type": "integer", "minimum": 0, "maximum": PID_MAX, "description": "0: none"}
    holder_fields: Dict[str, Dict[str, Any]] = {"name": _STR, "pid": pid, "host": _STR, "label": _STR}
    device_fields = {
        "uuid": _STR,
        "index": _INT,
        "name": _STR,
        "memory_mib": _INT,
        "node": _STR,
        "healthy": {"type": "boolean"},
        "allocated_mib": _INT,
    }
    return {
        "GpuRequestBody": {
            **_object(
                {
                    "count": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_GPUS_PER_REQUEST,
                        "default": 1,
                        "description": "distinct GPUs",
                    },
                    "fraction": {
                        "type": ["number", "null"],
                        "minimum": MIN_FRACTION,
                        "maximum": 1,
                        "description": "share of each GPU's memory (rounded up to whole MiB, at least 1 MiB)",
                    },
                    "memory_mib": {"type": ["integer", "null"], "minimum": 1, "description": "MiB of each GPU"},
                    "filters": {
                        "type": ["array", "null"],
                        "items": {"type": "string", "pattern": FILTER_PATTERN},
                        "examples": [["device.name=*A100*", "device.memory>=16GiB"]],
                    },
                }
            ),
            # exactly one of the two is a number (the other absent or null)
            "oneOf": [
                {"required": ["fraction"], "properties": {"fraction": {"type": "number"}}},
                {"required": ["memory_mib"], "properties": {"memory_mib": {"type": "integer"}}},
            ],
            "description": "N distinct GPUs, each with exactly one of fraction or memory_mib",
        },
        "ClaimBody": _object(
            {
                "requests": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_REQUESTS_PER_CLAIM,
                    "items": ref("GpuRequestBody"),
                    "description": "granted all together or not at all (a gang: one per replica)",
                },
                "policy": {"type": "string", "enum": [p.value for p in Policy], "default": DEFAULT_POLICY},
                "queue": {
                    "type": "string",
                    "pattern": f"^({QUEUE_NAME_RE.pattern})?$",
                    "default": "",
                    "description": "the queue (GET /v1/queues); a token bound to a queue claims in it only",
                },
                "priority": {
                    "type": "integer",
                    "minimum": -MAX_PRIORITY,
                    "maximum": MAX_PRIORITY,
                    "default": 0,
                    "description": "higher first inside the queue",
                },
                "preempt_grace_s": {
                    "type": ["number", "null"],
                    "minimum": 0,
                    "maximum": MAX_PREEMPT_GRACE_S,
                    "description": "seconds between SIGTERM and SIGKILL when preempted (default: the server's)",
                },
            },
            ("requests",),
        ),
        "HolderRequest": {
            **_object({key: dict(kind, type=[kind["type"], "null"]) for key, kind in holder_fields.items()}),
            "type": ["object", "null"],
            "description": "name is set by the server from the token's name when auth is on",
        },
        "ClaimRequest": _object(
            {
                "claim": ref("ClaimBody"),
                "holder": ref("HolderRequest"),
                "wait_s": {
                    "type": ["number", "null"],
                    "minimum": 0,
                    "maximum": MAX_WAIT_S,
                    "default": 0,
                    "description": "seconds to wait in the FIFO queue; 0 fails at once",
                },
                "ttl_s": {
                    "type": ["number", "null"],
                    "minimum": MIN_TTL_S,
                    "maximum": MAX_TTL_S,
                    "description": "the lease expires this long after the last heartbeat (default: the server's)",
                },
                "key": {
                    "type": ["string", "null"],
                    "pattern": KEY_PATTERN,
                    "description": "a random id the client picks for this claim and sends with each try of it: "
                    "a retry (the answer was lost, the server restarted) gets the lease granted to it, "
                    "or its place in the queue back",
                },
            },
            ("claim",),
            closed=True,
        ),
        "TokenRequest": _object(
            {
                "name": {"type": "string", "pattern": NAME_PATTERN, "not": {"const": ADMIN_NAME}},
                "admin": {"type": "boolean", "default": False},
                "queue": {
                    "type": ["string", "null"],
                    "pattern": f"^({QUEUE_NAME_RE.pattern})?$",
                    "description": "the one queue (it must exist) its claims may use",
                },
            },
            ("name",),
            closed=True,
        ),
        "HolderBody": _object(holder_fields, tuple(holder_fields)),
        "SliceBody": _object({"uuid": _STR, "memory_mib": _INT, "group": _INT}, ("uuid", "memory_mib", "group")),
        "LeaseBody": _object(
            {
                "id": _STR,
                "holder": ref("HolderBody"),
                "devices": {"type": "array", "items": ref("SliceBody")},
                "ttl_s": _NUM,
                "created_at": _NUM,
                "expires_at": _NUM,
                "queue": _STR,
                "priority": _INT,
                "preempt_grace_s": _NUM,
                "preempted_at": {"type": ["number", "null"], "description": "when the pool told it to stop"},
                "attest": {
                    **_object({"key": _STR, "socket": _STR}, ("key", "socket")),
                    "description": "in a claim's answer only: the lease's key and the node's attestation "
                    "socket, where the claimant proves its pid (gpupool run does)",
                },
            },
            ("id", "holder", "devices", "ttl_s", "created_at", "expires_at"),
        ),
        "LeaseList": _object({"leases": {"type": "array", "items": ref("LeaseBody")}}, ("leases",)),
        "Released": _object({"released": _STR}, ("released",)),
        "DeviceBody": _object(device_fields, tuple(device_fields)),
        "DeviceList": _object({"devices": {"type": "array", "items": ref("DeviceBody")}}, ("devices",)),
        "PoolStatusBody": _object(
            {
                "devices": {"type": "array", "items": ref("DeviceBody")},
                "leases": {"type": "array", "items": ref("LeaseBody")},
                "queued": {"type": "integer", "minimum": 0},
                "node": _STR,
                "isolation": _object({"mode": _STR, "mps_pipe_dir": _STR, "mps_log_dir": _STR}, ("mode",)),
                "usage": {"type": ["object", "null"], "description": "the watchdog's last sample"},
                "problems": {"type": "array", "items": _STR, "description": "leases on GPUs gone or too small"},
                "queues": {"type": "array", "items": ref("QueueBody")},
            },
            ("devices", "leases", "queued", "node", "isolation", "usage", "problems"),
        ),
        "QueueRequest": _object(
            {
                "quota": {"type": "number", "minimum": 0, "description": "GPUs guaranteed (1.5 = 1.5 GPUs' worth)"},
                "weight": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": 1},
                "limit": {"type": ["number", "null"], "minimum": 0, "description": "GPUs at most, borrowing included"},
            },
            ("quota",),
            closed=True,
        ),
        "QueueBody": _object(
            {
                "name": _STR,
                "quota": _NUM,
                "weight": _NUM,
                "limit": {"type": ["number", "null"]},
                "allocated": _NUM,
                "borrowed": _NUM,
                "waiting": _INT,
                "preemptions": _INT,
            },
            ("name", "quota", "weight", "limit", "allocated", "borrowed", "waiting", "preemptions"),
        ),
        "QueueList": _object({"queues": {"type": "array", "items": ref("QueueBody")}}, ("queues",)),
        "QueueDeleted": _object({"deleted": _STR}, ("deleted",)),
        "UsageBody": _object(
            {
                "since": _NUM,
                "until": _NUM,
                "by": {"type": "string", "enum": list(USAGE_KEYS)},
                "usage": {
                    "type": "array",
                    "items": _object(
                        {"key": _STR, "gpu_seconds": _NUM, "gpu_hours": _NUM, "leases": _INT},
                        ("key", "gpu_seconds", "gpu_hours", "leases"),
                    ),
                },
            },
            ("since", "until", "by", "usage"),
        ),
        "TokenBody": _object({"name": _STR, "token": _STR}, ("name", "token")),
        "DoctorReport": _object(
            {
                "db": _STR,
                "healthy": {"type": "boolean"},
                "verdict": _STR,
                "problems": {
                    "type": "array",
                    "items": _object({"kind": _STR, "message": _STR}, ("kind", "message")),
                },
                "devices": _INT,
                "leases": _INT,
                "tickets": _INT,
            },
            ("db", "healthy", "verdict", "problems", "devices", "leases", "tickets"),
        ),
        "Health": _object({"status": {"const": "ok"}}, ("status",)),
        "ErrorDetail": _object({"code": _STR, "message": _STR, "request_id": _STR}, ("code", "message")),
        "ErrorBody": _object({"error": ref("ErrorDetail")}, ("error",)),
    }


TEXT = "text"  # the Prometheus text format instead of a JSON schema
# (path, method) -> (success status, its schema, error statuses it may answer). Errors 401 and
# the 403s of auth are dropped when the server runs without auth (see `responses`).
OPERATIONS: Dict[Tuple[str, str], Tuple[int, str, Tuple[int, ...]]] = {
    ("/v1/leases", "post"): (201, "LeaseBody", (400, 401, 403, 409, 413, 422, 503)),
    ("/v1/leases", "get"): (200, "LeaseList", (401, 503)),
    ("/v1/leases/{lease_id}", "get"): (200, "LeaseBody", (400, 401, 404, 503)),
    ("/v1/leases/{lease_id}", "delete"): (200, "Released", (401, 403, 404, 503)),
    ("/v1/leases/{lease_id}/heartbeat", "post"): (200, "LeaseBody", (401, 403, 404, 503)),
    ("/v1/status", "get"): (200, "PoolStatusBody", (401, 503)),
    ("/v1/devices", "get"): (200, "DeviceList", (401, 503)),
    ("/v1/tokens", "post"): (201, "TokenBody", (400, 401, 403, 413, 503)),
    ("/v1/doctor", "get"): (200, "DoctorReport", (401, 403, 503)),
    ("/v1/queues", "get"): (200, "QueueList", (401, 503)),
    ("/v1/queues/{name}", "put"): (200, "QueueBody", (400, 401, 403, 413, 503)),
    ("/v1/queues/{name}", "delete"): (200, "QueueDeleted", (400, 401, 403, 404, 503)),
    ("/v1/usage", "get"): (200, "UsageBody", (400, 401, 503)),
    ("/healthz", "get"): (200, "Health", ()),
    ("/metrics", "get"): (200, TEXT, ()),
}
# Operations that answer 403 without auth too (a server without auth mints no tokens).
_FORBIDDEN_WITHOUT_AUTH = {("/v1/tokens", "post")}
REQUEST_BODIES = {
    ("/v1/leases", "post"): "ClaimRequest",
    ("/v1/tokens", "post"): "TokenRequest",
    ("/v1/queues/{name}", "put"): "QueueRequest",
}
_DESCRIPTIONS = {
    400: "bad input (not JSON, nested too deeply, a field of the wrong kind)",
    401: "no token, or one this pool does not honour",
    403: "the token may not do this (an admin's call, a lease of another, a queue its token is not bound to)",
    404: "no such lease or queue",
    409: "no room now, and the wait ran out",
    413: "the body is over 1 MiB",
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


def request_body(name: str) -> Dict[str, Any]:
    """The `requestBody` of an operation whose JSON body (schema `name`) we parse ourselves."""
    return {"required": True, "content": {"application/json": {"schema": ref(name)}}}


def body_schema(model: type) -> Dict[str, Any]:
    """`openapi_extra` that documents a JSON request body we parse ourselves."""
    return {"requestBody": request_body(model.__name__)}


__all__: List[str] = ["component_schemas", "OPERATIONS", "responses", "body_schema", "request_body", "REQUEST_BODIES"]
