"""The queue and usage routes written by hand: `PUT /v1/queues/{name}`, `GET /v1/usage` and
`GET /v1/history`; listing and deleting queues, the waiting claims (`GET /v1/queue`) and a waiting
claim's hold, release, cancel and priority (`/v1/claims/{id}/...`) are generated from the
operation table (`operation_routes`).

Listing queues, waiting claims and usage needs any valid token; creating, changing and deleting a
queue needs an admin token; holding, releasing and reprioritising a waiting claim its holder's
token or an admin's. A body is validated by `models.QueueRequest` and query values here, for their
JSON kind and range (a quota "1" or NaN is a 400, never a 500); the pool checks the rest
(`QueueSpec`, quota sums).
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, Optional

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ..core.errors import InvalidInput
from ..core.queues import QueueSpec, check_usage_key
from .models import QueueRequest, validated
from .routes import Admin, Api, Caller, json_response, read_body
from .wire import json_object

# `since` below this is "seconds ago", at or above it epoch seconds (2001-09-09: no pool is older).
EPOCH_SINCE = 1e9

queue_routes = APIRouter(prefix="/v1", tags=["queues"])


@queue_routes.put(
    "/queues/{name}",
    summary="Create or change a queue (admin only)",
)
async def put_queue(name: str, request: Request, api: Api, _admin: Admin) -> Response:
    spec = parse_queue(name, json_object(await read_body(request)))
    status = await run_in_threadpool(api.pool.set_queue, spec)
    return json_response(status.to_dict())


@queue_routes.get("/usage", summary="GPU-seconds per queue, holder or label since a time (one user's, one queue's)")
async def usage(
    api: Api,
    _identity: Caller,
    since: str = "86400",
    until: Optional[str] = None,
    by: str = "queue",
    user: str = "",
    queue: str = "",
) -> Response:
    now = time.time()
    start = parse_since(since, now)
    end = None if until is None else _finite("until", until)
    if end is not None and end <= start:
        raise InvalidInput(f"until {until!r} must be after since ({start:.0f}): give epoch seconds")
    rows = await run_in_threadpool(api.pool.usage, start, end, check_usage_key(by), user, queue)
    return json_response(
        {"since": start, "until": now if end is None else end, "by": by, "usage": [r.to_dict() for r in rows]}
    )


@queue_routes.get("/history", summary="Each lease that ended since a time: holder, share, span, how it ended")
async def history(api: Api, _identity: Caller, since: str = "86400", until: Optional[str] = None) -> Response:
    now = time.time()
    start = parse_since(since, now)
    end = None if until is None else _finite("until", until)
    if end is not None and end <= start:
        raise InvalidInput(f"until {until!r} must be after since ({start:.0f}): give epoch seconds")
    rows = await run_in_threadpool(api.pool.history, start, end)
    return json_response({"since": start, "until": now if end is None else end, "leases": [r.to_dict() for r in rows]})


def parse_queue(name: str, body: Dict[str, Any]) -> QueueSpec:
    """The QueueSpec of a PUT body (`QueueRequest`) for the queue of the path; QueueSpec checks
    the name and what spans fields (a limit below the quota)."""
    request = validated(QueueRequest, body)
    weight = 1.0 if request.weight is None else request.weight
    return QueueSpec(
        name,
        request.quota,
        weight,
        request.limit,
        request.preempt,
        request.idle_suspend_s,
        request.default_time_s,
        request.max_time_s,
    )


def parse_since(text: str, now: float) -> float:
    """`since` as epoch seconds: a value under EPOCH_SINCE counts back from now."""
    value = _finite("since", text)
    if value < 0:
        raise InvalidInput(f"since {text!r} must be seconds ago (e.g. 86400) or epoch seconds, not negative")
    return now - value if value < EPOCH_SINCE else value


def _finite(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidInput(f"{name} {text!r} must be a finite number of seconds")
    return value
