"""The API's dependencies, who calls (`caller`, `admin`, `minter`), and its routes written by hand:
the claim, the lease's GET (and its `?watch=` long poll), the release and the probes; every other
route is generated from the operation table (`operation_routes`).

Routes find the app's `LeaseApi` on `request.app.state.api` (set by
`create_app`), so the routers are module-level and several apps (tests) can
include them. Every dependency is `async def`: FastAPI runs a plain `def`
dependency in a worker thread, which would cost more than the token lookup.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Optional

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ...core.errors import Forbidden, InvalidInput, Unauthorized
from ...core.model import Lease
from .auth import Identity, require_admin
from .handlers import LeaseApi, dumps
from .wire import check_size

# A watch (GET /v1/leases/{id}?watch=S) answers after S seconds at most.
MAX_WATCH_S = 60.0


# --- dependencies -------------------------------------------------------------
async def lease_api(request: Request) -> LeaseApi:
    """The `LeaseApi` of the app serving `request`."""
    api: LeaseApi = request.app.state.api
    return api


Api = Annotated[LeaseApi, Depends(lease_api)]


async def caller(request: Request, api: Api) -> Identity:
    """Who sent the request, from its bearer token; Unauthorized (401) without a valid one."""
    return api.identify(request.headers.get("authorization"))


Caller = Annotated[Identity, Depends(caller)]


async def admin(request: Request, identity: Caller) -> Identity:
    """The caller, who must hold an admin token; Forbidden (403) otherwise."""
    require_admin(identity, f"{request.method} {request.url.path}")
    return identity


Admin = Annotated[Identity, Depends(admin)]

# Every caller is admin without auth: minting would hand admin tokens to anyone on this host.
NO_AUTH_NO_TOKENS = (
    "this server runs without auth (no --token-file), so it makes no tokens: restart it with "
    "--token-file FILE and use that admin token, or run `gpupool token create --state DIR` on its host"
)


async def minter(api: Api, identity: Admin) -> Identity:
    """The caller of an operation that makes a token: an admin, on a server with auth (Forbidden, 403,
    on one without: it makes no tokens)."""
    if api.auth is None:
        raise Forbidden(NO_AUTH_NO_TOKENS)
    return identity


Minter = Annotated[Identity, Depends(minter)]


async def claimer(request: Request, api: Api) -> Identity:
    """The caller of a claim: as `caller`, and a refused token counts as a denied claim in /metrics."""
    try:
        return api.identify(request.headers.get("authorization"))
    except (Unauthorized, Forbidden):
        api.claim_denied()
        raise


Claimer = Annotated[Identity, Depends(claimer)]


async def read_body(request: Request) -> bytes:
    """The request body, refused (413) as soon as it passes the size limit."""
    length = request.headers.get("content-length", "")
    if length.isdigit():
        check_size(int(length))
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        check_size(size)
        chunks.append(chunk)
    return b"".join(chunks)


def json_response(data: Any, status: int = 200) -> Response:
    # A ready Response skips FastAPI's response validation and encoder: the
    # payloads are already plain dicts in the one wire format (to_dict()).
    return Response(dumps(data), status_code=status, media_type="application/json")


# --- leases ---------------------------------------------------------------------
lease_routes = APIRouter(prefix="/v1/leases", tags=["leases"])


@lease_routes.post(
    "",
    status_code=201,
    summary="Claim GPUs: granted now, after waiting in the FIFO queue, or refused",
)
async def claim(request: Request, api: Api, identity: Claimer) -> Response:
    """POST /v1/leases; a waiting claim polls with asyncio and gives up when the client leaves."""
    lease = await api.claim(identity, await read_body(request), request.is_disconnected)
    return json_response(lease, 201)


@lease_routes.get(
    "/{lease_id}",
    summary="One live lease; with ?watch=S, answers when its runner has a step to take (preempted, "
    "to park, to restore) or after S seconds (0 < S <= 60)",
)
async def get_lease(
    lease_id: str, request: Request, api: Api, _identity: Caller, watch: Optional[str] = None
) -> Response:
    if watch is None:
        lease = await run_in_threadpool(api.pool.lease, lease_id)
    else:
        lease = await watch_lease(api, lease_id, parse_watch(watch), request.is_disconnected)
    return json_response(lease.to_dict())


def parse_watch(text: str) -> float:
    """The seconds of `?watch=S`: a finite number in (0, MAX_WATCH_S]."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= MAX_WATCH_S):  # also refuses NaN
        raise InvalidInput(f"watch {text!r} must be seconds in (0, {MAX_WATCH_S:g}], e.g. ?watch=30")
    return seconds


async def watch_lease(api: LeaseApi, lease_id: str, seconds: float, disconnected: Any) -> Lease:
    """The lease once its runner has a step to take, or as it is after `seconds`; NotFound once it
    is gone. A coroutine on the event loop, woken by the write that changes the lease (pool/watch.py)."""
    return await api.pool.watcher.watch_async(lease_id, seconds, disconnected)


@lease_routes.delete(
    "/{lease_id}", summary="Release a lease (holder or admin); the body may say its command's exit code"
)
async def release(lease_id: str, request: Request, api: Api, identity: Caller) -> Response:
    return json_response(api.release(identity, lease_id, await read_body(request)))


# --- operations (no auth: probes and scrapers carry no token) ---------------------
operation_routes = APIRouter(tags=["operations"])


@operation_routes.get("/healthz", summary="Liveness (no auth)")
async def healthz() -> Response:
    return json_response({"status": "ok"})


@operation_routes.get("/metrics", summary="Prometheus metrics (no auth)")
async def prometheus(api: Api) -> Response:
    body = await run_in_threadpool(api.metrics.render)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


ROUTERS = (lease_routes, operation_routes)
