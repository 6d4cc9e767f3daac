"""The API's routers and their dependencies: who calls (`caller`, `admin`), leases, pool, operations.

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

from ..core.errors import Forbidden, InvalidInput, Unauthorized
from ..core.model import Lease
from .auth import Identity, create_token, list_tokens, require_admin, require_queue, revoke_token, rotate_token
from .handlers import LeaseApi, dumps
from .models import TokenRequest, validated
from .wire import check_size, json_object

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
# Every caller is admin without auth: minting would hand admin tokens to anyone on this host.
NO_AUTH_NO_TOKENS = (
    "this server runs without auth (no --token-file), so it makes no tokens: restart it with "
    "--token-file FILE and use that admin token, or run `gpupool token create --state DIR` on its host"
)

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


@lease_routes.post("/{lease_id}/heartbeat", summary="Renew a lease by its TTL (holder or admin)")
async def heartbeat(lease_id: str, api: Api, identity: Caller) -> Response:
    return json_response(api.heartbeat(identity, lease_id))


@lease_routes.delete(
    "/{lease_id}", summary="Release a lease (holder or admin); the body may say its command's exit code"
)
async def release(lease_id: str, request: Request, api: Api, identity: Caller) -> Response:
    return json_response(api.release(identity, lease_id, await read_body(request)))


# --- pool -------------------------------------------------------------------------
pool_routes = APIRouter(prefix="/v1", tags=["pool"])


@pool_routes.post(
    "/tokens",
    status_code=201,
    summary="Create or rotate a named token (admin only)",
)
async def tokens(request: Request, api: Api, _admin: Admin) -> Response:
    if api.auth is None:
        raise Forbidden(NO_AUTH_NO_TOKENS)
    body = validated(TokenRequest, json_object(await read_body(request)))
    name, is_admin, queue = body.name, body.admin, body.queue or ""
    if queue:
        await run_in_threadpool(require_queue, api.pool, queue)
    token = await run_in_threadpool(create_token, api.pool.store, name, is_admin, "api", queue, body.replace)
    api.auth.forget()  # this process must see the replacement now, not after the lookup cache expires
    return json_response({"name": name, "token": token}, 201)


@pool_routes.get("/tokens", summary="The named tokens: name, admin, queue, origin, created, last used (admin only)")
async def token_list(api: Api, _admin: Admin) -> Response:
    rows = await run_in_threadpool(list_tokens, api.pool.store)
    return json_response({"tokens": [row.to_dict() for row in rows]})


@pool_routes.delete("/tokens/{name}", summary="Revoke a named token (admin only)")
async def token_revoke(name: str, api: Api, _admin: Admin) -> Response:
    await run_in_threadpool(revoke_token, api.pool.store, name)
    if api.auth is not None:
        api.auth.forget()  # refused here from now on
    return json_response({"revoked": name})


@pool_routes.post("/tokens/{name}/rotate", summary="A new token for a name, as it was; the old one stops (admin only)")
async def token_rotate(name: str, api: Api, _admin: Admin) -> Response:
    if api.auth is None:
        raise Forbidden(NO_AUTH_NO_TOKENS)
    token = await run_in_threadpool(rotate_token, api.pool.store, name, "api")
    api.auth.forget()
    return json_response({"name": name, "token": token}, 201)


@pool_routes.get("/doctor", summary="Check the pool's invariants and its database (admin only)")
async def doctor(api: Api, _admin: Admin) -> Response:
    from ..pool.doctor import check_state

    return json_response((await run_in_threadpool(check_state, api.pool.state_dir)).to_dict())


# --- operations (no auth: probes and scrapers carry no token) ---------------------
operation_routes = APIRouter(tags=["operations"])


@operation_routes.get("/healthz", summary="Liveness (no auth)")
async def healthz() -> Response:
    return json_response({"status": "ok"})


@operation_routes.get("/metrics", summary="Prometheus metrics (no auth)")
async def prometheus(api: Api) -> Response:
    body = await run_in_threadpool(api.metrics.render)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


ROUTERS = (lease_routes, pool_routes, operation_routes)
