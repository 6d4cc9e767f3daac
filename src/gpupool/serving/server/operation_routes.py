"""The routes generated from the operation table: one route per `core.operations` entry with `route`.

Each route is the entry's method and path, its caller checked as the entry says (`who`), its
body validated by the request model the entry names (`models.REQUESTS`, through
`wire.json_object`), and its answer the pool's own (`operations.invoke`, the same call the
in-process client makes), written by the entry's `to_wire`. The OpenAPI document sees the
path's parameters and the dependencies as it would on a hand-written route; its answers and
request bodies come from the same entries (`schemas.OPERATIONS`, `schemas.REQUEST_BODIES`).
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Awaitable, Callable, Dict, Optional, Type

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from ...core import operations as ops
from ...core.operations import Operation, arguments, invoke
from .auth import Identity
from .models import REQUESTS, validated
from .routes import Admin, Api, Caller, Minter, json_response, read_body
from .wire import json_object

_MODELS: Dict[str, Type[BaseModel]] = {model.__name__: model for model in REQUESTS}
_WHO = {ops.ANYONE: Caller, ops.ADMIN: Admin, ops.MINTER: Minter}


def endpoint(op: Operation[Any]) -> Callable[..., Awaitable[Response]]:
    """The route function of `op`: path and query arguments by name, the caller, the pool's answer."""
    model = _MODELS[op.request] if op.request else None

    async def answer(request: Request, api: Any, identity: Identity, **given: Optional[str]) -> Response:
        # A query field not given (or empty) is None: the pool reads it as "not said"; an entry that
        # reads its request itself gets the values as sent.
        args: Dict[str, Any] = dict(given) if op.read else {name: value or None for name, value in given.items()}
        if model is not None:
            body = validated(model, json_object(await read_body(request)))
            args.update((name, getattr(body, name)) for name in op.body)
        if op.read is not None:
            args = op.read(args, time.time())
        if op.timed:  # a runner's report: its step's seconds go to /metrics
            result = await run_in_threadpool(api.timed_step, op, args, identity)
        elif op.inline:  # one small transaction: cheaper than the hop to a worker thread
            result = invoke(api.pool, op, args, identity.requester, identity.name)
        elif op.serve:  # a server's own operation (the tokens, the doctor)
            result = await run_in_threadpool(
                getattr(api, op.serve), *arguments(op, args, identity.requester, identity.name)
            )
        else:
            result = await run_in_threadpool(invoke, api.pool, op, args, identity.requester, identity.name)
        return json_response(result if op.as_served else op.to_wire(result, args), op.status)

    # FastAPI reads the parameters (the path's, the dependencies) from the signature.
    keyword = inspect.Parameter.KEYWORD_ONLY
    defaults = dict(op.defaults)
    answer.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, keyword, annotation=str) for name in op.path_args()]
        + [
            inspect.Parameter("request", keyword, annotation=Request),
            inspect.Parameter("api", keyword, annotation=Api),
            inspect.Parameter("identity", keyword, annotation=_WHO[op.who]),
        ]
        + [
            inspect.Parameter(name, keyword, default=defaults[name], annotation=str)
            if name in defaults
            else inspect.Parameter(name, keyword, default=None, annotation=Optional[str])
            for name in op.query
        ],
        return_annotation=Response,
    )
    answer.__name__ = op.name
    return answer


operation_routes = APIRouter()
for _op in ops.OPERATIONS:
    if _op.route:
        operation_routes.add_api_route(
            _op.path,
            endpoint(_op),
            methods=[_op.method],
            status_code=_op.status,
            summary=_op.summary,
            tags=[_op.group],
            name=_op.route_name or _op.name,
        )
