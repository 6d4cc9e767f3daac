"""The queue route written by hand: `PUT /v1/queues/{name}`; listing and deleting queues, the
waiting claims (`GET /v1/queue`), a waiting claim's hold, release, cancel and priority
(`/v1/claims/{id}/...`), usage and history are generated from the operation table
(`operation_routes`).

Creating and changing a queue needs an admin token. A body is validated by `models.QueueRequest`
for its JSON kind and range (a quota "1" or NaN is a 400, never a 500); the pool checks the rest
(`QueueSpec`, quota sums).
"""

from __future__ import annotations

from typing import Any, Dict

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ..core.queues import QueueSpec
from .models import QueueRequest, validated
from .routes import Admin, Api, json_response, read_body
from .wire import json_object

queue_routes = APIRouter(prefix="/v1", tags=["queues"])


@queue_routes.put(
    "/queues/{name}",
    summary="Create or change a queue (admin only)",
)
async def put_queue(name: str, request: Request, api: Api, _admin: Admin) -> Response:
    spec = parse_queue(name, json_object(await read_body(request)))
    status = await run_in_threadpool(api.pool.set_queue, spec)
    return json_response(status.to_dict())


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
