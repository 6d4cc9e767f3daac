"""The pool's operations, each declared once: its route, who may call it, its request and answer.

One `Operation` per verb (claim, heartbeat, release, suspend, the queue verbs, tokens, ...). What
is derived from the table, and where:

- `client.base.PoolClient`: one abstract `call(op, **args)`; every method is one line over it.
- `client.http.HttpPoolClient.call`: the HTTP request of any operation (`path`, `query`, `body`,
  `encode`) and its answer (`decode`).
- the in-process pool: `invoke(pool, op, args, ...)` calls the `Pool` method the entry names
  (`pool`, `pool_args`); `client.embedded` is that call and nothing else.
- the server: routes of the entries with `route` set (`server.operation_routes`), and the OpenAPI
  document's answers, errors and request bodies of every entry (`server.schemas`); the pydantic
  request models stay on the server and are named here by their class name (`request`).

Standard library only, as the whole workload side: the answer decoders import the queue classes
only when called (`gpupool run` never lists a queue).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Generic, List, Mapping, Optional, Tuple, TypeVar

from .errors import InvalidInput
from .model import Lease
from .status import PoolStatus, WaitingClaim
from .suspension import RUNNING, SUSPENDED

if TYPE_CHECKING:
    from .queues import LeaseRecord, QueueStatus, UsageRow

A = TypeVar("A")

# Who may call an operation (the server checks it before the pool runs): any valid token (the pool
# itself then checks that a lease or waiting claim is the caller's own, or the caller an admin),
# an admin token only, or an admin token of a server with auth (one without makes no tokens: every
# caller is its admin, so a token made there would hand admin to anyone on its host).
ANYONE = "token"
ADMIN = "admin"
MINTER = "minter"

# What `pool_args` may name besides the operation's own arguments: filled in by the side that
# calls the pool. The requester is the holder name whose leases the caller may touch (None: an
# admin, or the embedded pool's local user); the caller is the name said in the history.
REQUESTER = "<requester>"
CALLER = "<caller>"

# Errors each kind of operation can answer (the OpenAPI document lists them).
READ_ERRORS = (401, 503)
LEASE_ERRORS = (400, 401, 403, 404, 413, 503)
ADMIN_ERRORS = (400, 401, 403, 413, 503)

Query = Dict[str, str]
Body = Optional[Dict[str, Any]]


@dataclass(frozen=True)
class Operation(Generic[A]):
    """One verb of the pool API.

    Args:
        name: the verb (and `PoolClient`'s method name, where it has one).
        method, path: its HTTP route; `{x}` in the path is the argument `x`.
        summary: one line for the OpenAPI document.
        who: ANYONE, ADMIN or MINTER.
        answer: the answer's schema name in the OpenAPI document (`server.schemas`).
        decode: the answer's JSON object -> the value the client returns.
        status, errors: the success status and the error statuses it can answer.
        request: the request body's model name (`server.models`); "" without a body.
        body: the arguments sent as the JSON body's fields (and read back from it on the server).
        query: the arguments sent in the query string (str() of each; None and "" left out).
        defaults: (field, value) of query fields the server reads as `value` when not given (its
            OpenAPI default); a field without one is None when not given.
        encode: (query, body) of the arguments, where the defaults above do not say it.
        pool, pool_args: the `Pool` method (dotted: of a part of the pool) that answers it
            in-process, and what it is called with (argument names, REQUESTER, CALLER); pool ""
            where only a server answers it.
        serve: where only a server answers it (the tokens, the doctor): its own method that does
            (`server.handlers.LeaseApi`), called as the pool's would be (`pool_args`).
        to_wire: (the pool's answer, the arguments) -> the answer's JSON object (the server's side
            of `decode`).
        read: (the path's, query's and body's values as sent, the server's clock) -> the call's
            arguments, InvalidInput (400) naming a bad one: the server's side of `encode`, where the
            request is not the arguments themselves. None: a query field not given or "" is None.
        route: the server's route is generated from this entry (else written in server/routes).
        inline: the server answers it on its event loop, not in a worker thread: one small
            transaction, cheaper than the hop (a hot call: the fast path answers it the same way).
        timed: a runner's report of a step (parked, restored): the state the lease reaches when the
            step is done; the server then observes the step's seconds, from its start to the
            report, in /metrics (the step's histogram, `server.handlers.LeaseApi.timed_step`).
        waits: the argument whose seconds the server may hold the request (the client waits longer).
        retry: whether a dropped connection may resend it (never a claim or a watch).
        channel: the client's connection for it: "" (the main one), "watch", or "ask".
        group: its tag in the OpenAPI document.
        as_served: the in-process answer is the pool's passed through `to_wire` and `decode`, as a
            server's would be (the pool method answers something else than the client returns).
        route_name: the stem of its OpenAPI operationId where the route had another name than
            `name` first (clients generated from the document keep their method names).
    """

    name: str
    method: str
    path: str
    summary: str
    who: str
    answer: str
    decode: Callable[[Dict[str, Any]], A]
    status: int = 200
    errors: Tuple[int, ...] = LEASE_ERRORS
    request: str = ""
    body: Tuple[str, ...] = ()
    query: Tuple[str, ...] = ()
    encode: Optional[Callable[[Mapping[str, Any]], Tuple[Query, Body]]] = None
    defaults: Tuple[Tuple[str, str], ...] = ()
    pool: str = ""
    pool_args: Tuple[str, ...] = ()
    serve: str = ""
    to_wire: Callable[[Any, Mapping[str, Any]], Dict[str, Any]] = field(default=lambda answer, _args: answer.to_dict())
    read: Optional[Callable[[Dict[str, Any], float], Dict[str, Any]]] = None
    route: bool = False
    inline: bool = False
    timed: str = ""
    waits: str = ""
    retry: bool = True
    channel: str = ""
    group: str = "leases"
    as_served: bool = False
    route_name: str = ""

    def path_args(self) -> Tuple[str, ...]:
        """The arguments named in the path, in order."""
        return tuple(part[1:-1] for part in self.path.split("/") if part.startswith("{") and part.endswith("}"))

    def wire(self, args: Mapping[str, Any]) -> Tuple[Query, Body]:
        """The query string's fields and the JSON body (None: no body) of a call with `args`."""
        if self.encode is not None:
            return self.encode(args)
        query = {name: str(args[name]) for name in self.query if args.get(name) not in (None, "")}
        body = {name: args[name] for name in self.body} if self.request else None
        return query, body


def invoke(pool: Any, op: Operation[A], args: Mapping[str, Any], requester: Optional[str], caller: str) -> A:
    """Answer `op` with the pool's own method: the in-process side of every operation."""
    if not op.pool:
        raise InvalidInput(f"{op.method} {op.path} is a pool server's: give --server URL (the embedded pool has none)")
    target = pool
    for part in op.pool.split("."):  # "claims.begin": a method of one of the pool's parts
        target = getattr(target, part)
    answer = target(*arguments(op, args, requester, caller))
    if op.as_served:  # the client's answer, as a server's would read
        return op.decode(op.to_wire(answer, args))
    return answer  # type: ignore[no-any-return]  # the pool method answers the entry's type


def arguments(op: Operation[Any], args: Mapping[str, Any], requester: Optional[str], caller: str) -> List[Any]:
    """What the pool method (or the server's, `serve`) of `op` is called with, in order."""
    filled = {REQUESTER: requester, CALLER: caller}
    return [filled[name] if name in filled else args[name] for name in op.pool_args]


# --- answers ---------------------------------------------------------------------------------
def _lease(data: Dict[str, Any]) -> Lease:
    return Lease.from_dict(data)


def _waiting_claim(data: Dict[str, Any]) -> WaitingClaim:
    return WaitingClaim.from_dict(data)


def _nothing(_data: Dict[str, Any]) -> None:
    return None


def _as_is(data: Dict[str, Any]) -> Dict[str, Any]:
    return data


def _queues(data: Dict[str, Any]) -> List[QueueStatus]:
    from .queues import QueueStatus  # lazily: the workload path never lists queues

    return [QueueStatus.from_dict(q) for q in data.get("queues", [])]


def _queue(data: Dict[str, Any]) -> QueueStatus:
    from .queues import QueueStatus

    return QueueStatus.from_dict(data)


def _usage(data: Dict[str, Any]) -> List[UsageRow]:
    from .queues import UsageRow

    return [UsageRow.from_dict(row) for row in data.get("usage", [])]


def _history(data: Dict[str, Any]) -> List[LeaseRecord]:
    from .queues import LeaseRecord

    return [LeaseRecord.from_dict(row) for row in data.get("leases", [])]


def _waiting(data: Dict[str, Any]) -> List[WaitingClaim]:
    return [WaitingClaim.from_dict(w) for w in data.get("waiting", [])]


def _token(token: str, args: Mapping[str, Any]) -> Dict[str, Any]:
    """The server's answer of a token made: the name and the token (shown once)."""
    return {"name": args["name"], "token": token}


def _listed(key: str) -> Callable[[Any, Mapping[str, Any]], Dict[str, Any]]:
    """The server's answer of a list: `{key: [each.to_dict()]}`."""
    return lambda rows, _args: {key: [row.to_dict() for row in rows]}


# --- requests the default encoding does not say --------------------------------------------
def _claim_wire(args: Mapping[str, Any]) -> Tuple[Query, Body]:
    body = {
        "claim": args["claim"].to_dict(),
        "holder": args["holder"].to_dict(),
        "wait_s": args["wait_s"],
        "ttl_s": args["ttl_s"],
    }
    if args["key"]:
        body["key"] = args["key"]
    return {}, body


def _release_wire(args: Mapping[str, Any]) -> Tuple[Query, Body]:
    said = {
        k: v for k, v in (("exit_code", args["exit_code"]), ("timed_out", args["timed_out"] or None)) if v is not None
    }
    return {}, said or None


def _watch_wire(args: Mapping[str, Any]) -> Tuple[Query, Body]:
    return {"watch": f"{args['timeout_s']:g}"}, None


def _queue_wire(args: Mapping[str, Any]) -> Tuple[Query, Body]:
    return {}, {k: v for k, v in args["spec"].to_dict().items() if k != "name"}


def _token_wire(args: Mapping[str, Any]) -> Tuple[Query, Body]:
    body: Dict[str, Any] = {"name": args["name"], "admin": args["admin"]}
    if args.get("queue"):  # only when bound: a server older than queues refuses the field
        body["queue"] = args["queue"]
    if args.get("replace"):  # likewise: a server before token lists replaced always
        body["replace"] = True
    return {}, body


def _empty_body(_args: Mapping[str, Any]) -> Tuple[Query, Body]:
    return {}, {}


def _span_wire(args: Mapping[str, Any]) -> Tuple[Query, Body]:
    """since and until as epoch seconds (repr: every digit), and the other query fields said."""
    query = {"since": repr(float(args["since"]))}
    query.update({k: str(v) for k, v in args.items() if k not in ("since", "until") and v})
    if args.get("until") is not None:
        query["until"] = repr(float(args["until"]))
    return query, None


_QUEUE_FIELDS = ("quota", "weight", "limit", "preempt", "idle_suspend_s", "default_time_s", "max_time_s")


def _queue_read(args: Dict[str, Any], _now: float) -> Dict[str, Any]:
    """The queue of the path with the body's fields (a weight of null is 1); QueueSpec checks the
    name and what spans fields (a limit below the quota)."""
    from .queues import QueueSpec

    fields = {name: args[name] for name in _QUEUE_FIELDS}
    if fields["weight"] is None:
        fields["weight"] = 1.0
    return {"spec": QueueSpec(args["name"], **fields)}


# The window a query gives when it says nothing (a day back from now); a client always says since.
_SPAN_DEFAULTS = (("since", "86400"),)


# --- the server's reading of requests (the other side of the encodings above) ---------------
def _span_read(args: Dict[str, Any], now: float) -> Dict[str, Any]:
    """since (seconds ago, or epoch seconds) and until (epoch seconds, after since; None: now) of
    the query; `by`, where the operation has it, one of the usage keys. `to` is the window's end the
    answer names (now where until is not said)."""
    from .queues import check_usage_key, query_seconds, query_since

    start = query_since(args["since"], now)
    until = args["until"]
    end = None if until is None else query_seconds("until", until)
    if end is not None and end <= start:
        raise InvalidInput(f"until {until!r} must be after since ({start:.0f}): give epoch seconds")
    read = dict(args, since=start, until=end, to=now if end is None else end)
    if "by" in args:
        read["by"] = check_usage_key(args["by"])
    return read


# --- the table -------------------------------------------------------------------------------
CLAIM: Operation[Lease] = Operation(
    "claim",
    "POST",
    "/v1/leases",
    "Claim GPUs: granted now, after waiting in the FIFO queue, or refused",
    ANYONE,
    "LeaseBody",
    _lease,
    status=201,
    errors=(400, 401, 403, 409, 413, 422, 503),
    request="ClaimRequest",
    encode=_claim_wire,
    pool="claim",
    pool_args=("claim", "holder", "wait_s", "ttl_s", "key"),
    waits="wait_s",
    retry=False,
)
HEARTBEAT: Operation[Lease] = Operation(
    "heartbeat",
    "POST",
    "/v1/leases/{lease_id}/heartbeat",
    "Renew a lease by its TTL (holder or admin)",
    ANYONE,
    "LeaseBody",
    _lease,
    errors=(401, 403, 404, 503),
    pool="heartbeat",
    pool_args=("lease_id", REQUESTER),
    route=True,
    inline=True,
)
RELEASE: Operation[None] = Operation(
    "release",
    "DELETE",
    "/v1/leases/{lease_id}",
    "Release a lease (holder or admin); the body may say its command's exit code",
    ANYONE,
    "Released",
    _nothing,
    request="ReleaseRequest",
    encode=_release_wire,
    pool="release",
    pool_args=("lease_id", REQUESTER, "exit_code", CALLER, "timed_out"),
)
STATUS: Operation[PoolStatus] = Operation(
    "status",
    "GET",
    "/v1/status",
    "Devices with their allocation, live leases, queue length",
    ANYONE,
    "PoolStatusBody",
    PoolStatus.from_dict,
    errors=READ_ERRORS,
    pool="status",
    route=True,
    group="pool",
)
LIST_LEASES: Operation[Dict[str, Any]] = Operation(
    "list_leases",
    "GET",
    "/v1/leases",
    "Live leases",
    ANYONE,
    "LeaseList",
    _as_is,
    errors=READ_ERRORS,
    pool="status",
    to_wire=lambda status, _args: {"leases": [lease.to_dict() for lease in status.leases]},
    as_served=True,
    route=True,
)
DEVICES: Operation[Dict[str, Any]] = Operation(
    "devices",
    "GET",
    "/v1/devices",
    "Devices with their allocated MiB",
    ANYONE,
    "DeviceList",
    _as_is,
    errors=READ_ERRORS,
    pool="status",
    to_wire=lambda status, _args: {"devices": status.to_dict()["devices"]},
    as_served=True,
    route=True,
    group="pool",
)
GET_LEASE: Operation[Lease] = Operation(
    "get_lease",
    "GET",
    "/v1/leases/{lease_id}",
    "One live lease; with ?watch=S, answers when its runner has a step to take (preempted, "
    "to park, to restore) or after S seconds (0 < S <= 60)",
    ANYONE,
    "LeaseBody",
    _lease,
    errors=(400, 401, 404, 503),
    pool="lease",
    pool_args=("lease_id",),
)
# The same route as GET_LEASE, with ?watch: the server holds it until the lease needs its runner.
WATCH: Operation[Lease] = Operation(
    "watch",
    "GET",
    "/v1/leases/{lease_id}",
    GET_LEASE.summary,
    ANYONE,
    "LeaseBody",
    _lease,
    errors=GET_LEASE.errors,
    encode=_watch_wire,
    pool="watch",
    pool_args=("lease_id", "timeout_s"),
    waits="timeout_s",
    retry=False,  # a watch cut by close() must end; the caller's loop watches again anyway
    channel="watch",  # never held behind, nor holding, the same lease's heartbeats
)
SUSPEND: Operation[Lease] = Operation(
    "suspend",
    "POST",
    "/v1/leases/{lease_id}/suspend",
    "Suspend a lease: its runner parks it (holder or admin)",
    ANYONE,
    "LeaseBody",
    _lease,
    request="SuspendRequest",
    body=("reason",),
    pool="suspend",
    pool_args=("lease_id", REQUESTER, "reason"),
    route=True,
)
RESUME: Operation[Lease] = Operation(
    "resume",
    "POST",
    "/v1/leases/{lease_id}/resume",
    "Resume a suspended lease when there is room (holder or admin)",
    ANYONE,
    "LeaseBody",
    _lease,
    request="ResumeRequest",
    pool="resume",
    pool_args=("lease_id", REQUESTER),
    route=True,
)
PARKED: Operation[Lease] = Operation(
    "report_parked",
    "POST",
    "/v1/leases/{lease_id}/parked",
    "The runner's word on a suspend: parked, or its error",
    ANYONE,
    "LeaseBody",
    _lease,
    request="ParkedReport",
    body=("host_bytes", "error"),
    pool="report_parked",
    pool_args=("lease_id", REQUESTER, "host_bytes", "error"),
    route=True,
    timed=SUSPENDED,
    route_name="parked",
)
RESTORED: Operation[Lease] = Operation(
    "report_restored",
    "POST",
    "/v1/leases/{lease_id}/restored",
    "The runner's word on a resume: restored, or its error",
    ANYONE,
    "LeaseBody",
    _lease,
    request="RestoredReport",
    body=("error",),
    pool="report_restored",
    pool_args=("lease_id", REQUESTER, "error"),
    route=True,
    timed=RUNNING,
    route_name="restored",
)
WAITING: Operation[List[WaitingClaim]] = Operation(
    "waiting",
    "GET",
    "/v1/queue",
    "Waiting claims in the order the pool grants them, each with why it waits",
    ANYONE,
    "WaitingList",
    _waiting,
    errors=(401, 404, 503),
    query=("queue", "key"),
    pool="waiting",
    pool_args=("queue", "key"),
    to_wire=_listed("waiting"),
    route=True,
    channel="ask",  # a waiting run asks its place on a connection of its own: the main one carries its claim
    group="queues",
)
HOLD_CLAIM: Operation[WaitingClaim] = Operation(
    "hold_claim",
    "POST",
    "/v1/claims/{claim_id}/hold",
    "Hold a waiting claim: it keeps its place, grants skip it (holder or admin)",
    ANYONE,
    "WaitingBody",
    _waiting_claim,
    request="HoldRequest",
    pool="hold",
    pool_args=("claim_id", REQUESTER),
    route=True,
    group="queues",
    route_name="hold",
)
RELEASE_CLAIM: Operation[WaitingClaim] = Operation(
    "release_claim",
    "POST",
    "/v1/claims/{claim_id}/release",
    "Release a held claim: grants take it again (holder or admin)",
    ANYONE,
    "WaitingBody",
    _waiting_claim,
    request="HoldRequest",
    pool="unhold",
    pool_args=("claim_id", REQUESTER),
    route=True,
    group="queues",
    route_name="unhold",
)
CANCEL_CLAIM: Operation[WaitingClaim] = Operation(
    "cancel_claim",
    "POST",
    "/v1/claims/{claim_id}/cancel",
    "Cancel a waiting claim: it leaves the queue, its waiter is told (holder or admin)",
    ANYONE,
    "WaitingBody",
    _waiting_claim,
    request="HoldRequest",
    pool="cancel_claim",
    pool_args=("claim_id", REQUESTER),
    route=True,
    group="queues",
    route_name="cancel",
)
CLAIM_PRIORITY: Operation[WaitingClaim] = Operation(
    "set_claim_priority",
    "PUT",
    "/v1/claims/{claim_id}/priority",
    "Change a waiting claim's priority in its queue (holder or admin)",
    ANYONE,
    "WaitingBody",
    _waiting_claim,
    request="PriorityRequest",
    body=("priority",),
    pool="set_priority",
    pool_args=("claim_id", "priority", REQUESTER),
    route=True,
    group="queues",
    route_name="priority",
)
QUEUES: Operation[List[QueueStatus]] = Operation(
    "queues",
    "GET",
    "/v1/queues",
    "Queues with their quota, weight, limit, allocated, borrowed, waiting",
    ANYONE,
    "QueueList",
    _queues,
    errors=READ_ERRORS,
    pool="queues",
    to_wire=_listed("queues"),
    route=True,
    group="queues",
    route_name="list_queues",
)
SET_QUEUE: Operation[QueueStatus] = Operation(
    "set_queue",
    "PUT",
    "/v1/queues/{name}",
    "Create or change a queue (admin only)",
    ADMIN,
    "QueueBody",
    _queue,
    errors=ADMIN_ERRORS,
    request="QueueRequest",
    body=_QUEUE_FIELDS,
    encode=_queue_wire,
    read=_queue_read,
    pool="set_queue",
    pool_args=("spec",),
    route=True,
    group="queues",
    route_name="put_queue",
)
DELETE_QUEUE: Operation[None] = Operation(
    "delete_queue",
    "DELETE",
    "/v1/queues/{name}",
    "Delete a queue without leases or waiting claims (admin only)",
    ADMIN,
    "QueueDeleted",
    _nothing,
    errors=(400, 401, 403, 404, 503),
    pool="delete_queue",
    pool_args=("name",),
    to_wire=lambda _none, args: {"deleted": args["name"]},
    route=True,
    group="queues",
)
USAGE: Operation[List[UsageRow]] = Operation(
    "usage",
    "GET",
    "/v1/usage",
    "GPU-seconds per queue, holder or label since a time (one user's, one queue's)",
    ANYONE,
    "UsageBody",
    _usage,
    errors=(400, 401, 503),
    query=("since", "until", "by", "user", "queue"),
    encode=_span_wire,
    defaults=(*_SPAN_DEFAULTS, ("by", "queue"), ("user", ""), ("queue", "")),
    read=_span_read,
    pool="usage",
    pool_args=("since", "until", "by", "user", "queue"),
    to_wire=lambda rows, args: {
        "since": args["since"],
        "until": args["to"],
        "by": args["by"],
        "usage": [row.to_dict() for row in rows],
    },
    route=True,
    group="queues",
)
HISTORY: Operation[List[LeaseRecord]] = Operation(
    "history",
    "GET",
    "/v1/history",
    "Each lease that ended since a time: holder, share, span, how it ended",
    ANYONE,
    "HistoryBody",
    _history,
    errors=(400, 401, 503),
    query=("since", "until"),
    encode=_span_wire,
    defaults=_SPAN_DEFAULTS,
    read=_span_read,
    pool="history",
    pool_args=("since", "until"),
    to_wire=lambda rows, args: {
        "since": args["since"],
        "until": args["to"],
        "leases": [row.to_dict() for row in rows],
    },
    route=True,
    group="queues",
)
# The tokens and the doctor: a server's alone (the embedded pool's are `token create --state` and
# `doctor --state`): the server's own methods answer them (`serve`; a token made, rotated or
# revoked also empties the authenticator's cache there).
CREATE_TOKEN: Operation[Dict[str, Any]] = Operation(
    "create_token",
    "POST",
    "/v1/tokens",
    "Create or rotate a named token (admin only)",
    MINTER,
    "TokenBody",
    _as_is,
    status=201,
    errors=ADMIN_ERRORS,
    request="TokenRequest",
    body=("name", "admin", "queue", "replace"),
    encode=_token_wire,
    serve="create_token",
    pool_args=("name", "admin", "queue", "replace"),
    to_wire=_token,
    route=True,
    retry=False,  # a token made twice is two
    group="pool",
    route_name="tokens",
)
LIST_TOKENS: Operation[Dict[str, Any]] = Operation(
    "list_tokens",
    "GET",
    "/v1/tokens",
    "The named tokens: name, admin, queue, origin, created, last used (admin only)",
    ADMIN,
    "TokenList",
    _as_is,
    errors=(401, 403, 503),
    serve="list_tokens",
    to_wire=_listed("tokens"),
    route=True,
    group="pool",
    route_name="token_list",
)
REVOKE_TOKEN: Operation[Dict[str, Any]] = Operation(
    "revoke_token",
    "DELETE",
    "/v1/tokens/{name}",
    "Revoke a named token (admin only)",
    ADMIN,
    "Revoked",
    _as_is,
    errors=(401, 403, 404, 503),
    serve="revoke_token",
    pool_args=("name",),
    to_wire=lambda _none, args: {"revoked": args["name"]},
    route=True,
    retry=False,
    group="pool",
    route_name="token_revoke",
)
ROTATE_TOKEN: Operation[Dict[str, Any]] = Operation(
    "rotate_token",
    "POST",
    "/v1/tokens/{name}/rotate",
    "A new token for a name, as it was; the old one stops (admin only)",
    MINTER,
    "TokenBody",
    _as_is,
    status=201,
    errors=(401, 403, 404, 503),
    encode=_empty_body,
    serve="rotate_token",
    pool_args=("name",),
    to_wire=_token,
    route=True,
    retry=False,
    group="pool",
    route_name="token_rotate",
)
DOCTOR: Operation[Dict[str, Any]] = Operation(
    "doctor",
    "GET",
    "/v1/doctor",
    "Check the pool's invariants and its database (admin only)",
    ADMIN,
    "DoctorReport",
    _as_is,
    errors=(401, 403, 503),
    serve="doctor",
    route=True,
    group="pool",
)

#: every operation, in the order the server's routes and the OpenAPI document list them
OPERATIONS: Tuple[Operation[Any], ...] = (
    CLAIM,
    LIST_LEASES,
    HEARTBEAT,
    RELEASE,
    STATUS,
    DEVICES,
    GET_LEASE,
    WATCH,
    SUSPEND,
    RESUME,
    PARKED,
    RESTORED,
    WAITING,
    HOLD_CLAIM,
    RELEASE_CLAIM,
    CANCEL_CLAIM,
    CLAIM_PRIORITY,
    QUEUES,
    SET_QUEUE,
    DELETE_QUEUE,
    USAGE,
    HISTORY,
    CREATE_TOKEN,
    LIST_TOKENS,
    REVOKE_TOKEN,
    ROTATE_TOKEN,
    DOCTOR,
)
