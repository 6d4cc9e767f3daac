"""`create_app(pool, auth=...)`: the FastAPI app of the /v1 API, /healthz and /metrics.

Request bodies are parsed with the core model's `from_dict`, so HTTP and the
store share one wire format and one set of error messages. The lease calls
live in `handlers.LeaseApi` (short transactions, inline on the loop; a waiting
claim polls its ticket with `asyncio.sleep`) and are served first by
`fastpath.FastPath`; reads of the whole pool run in worker threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Dict, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..core.errors import GpupoolError, InvalidInput
from ..pool import DEFAULT_TTL_S, Pool
from .auth import Authenticator, Identity, check_name, create_token, require_admin
from .fastpath import FastPath
from .handlers import LeaseApi, json_object
from .metrics import Metrics
from .schemas import ClaimRequest, ErrorBody, TokenRequest, body_schema, component_schemas

log = logging.getLogger(__name__)

ERRORS = {str(code): {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 422)}


def create_app(
    pool: Pool,
    auth: Optional[Authenticator] = None,
    *,
    default_ttl_s: float = DEFAULT_TTL_S,
    expire_interval_s: float = 1.0,
    title: str = "gpupool",
    fast_path: bool = True,
) -> FastAPI:
    """The API app over `pool`; `auth` None serves without tokens (loopback only, see serve)."""
    metrics = Metrics(pool)

    async def expiry_loop() -> None:
        # Reclaims leases of dead clients even when nobody calls the API.
        while True:
            await asyncio.sleep(expire_interval_s)
            try:
                expired = await run_in_threadpool(pool.expire)
                if expired:
                    metrics.expired.inc(len(expired))
            except Exception:
                log.warning("expiry failed", exc_info=True)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        task = asyncio.get_running_loop().create_task(expiry_loop())
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(
        title=title,
        version=__version__,
        description="Pool GPUs and share them fractionally. Send `Authorization: Bearer <token>` on /v1.",
        lifespan=lifespan,
    )
    app.state.pool = pool
    app.state.metrics = metrics
    app.state.auth = auth

    api = LeaseApi(pool, auth, metrics, default_ttl_s)

    def identify(request: Request) -> Identity:
        return api.identify(request.headers.get("authorization"))

    # --- errors: every failure is {"error": {"code", "message"}} --------------
    @app.exception_handler(GpupoolError)
    async def gpupool_error(_request: Request, err: GpupoolError) -> JSONResponse:
        return JSONResponse(err.to_dict(), status_code=err.http_status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, err: RequestValidationError) -> JSONResponse:
        detail = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in err.errors())
        return JSONResponse(InvalidInput(f"bad request: {detail}").to_dict(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        return JSONResponse(
            {"error": {"code": code, "message": str(err.detail)}}, status_code=err.status_code, headers=err.headers
        )

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, err: Exception) -> JSONResponse:
        log.error("internal error", exc_info=err)
        return JSONResponse({"error": {"code": "internal", "message": f"internal error: {err}"}}, status_code=500)

    # --- leases (the hot three are answered by FastPath first; same LeaseApi code) ---
    @app.post("/v1/leases", status_code=201, openapi_extra=body_schema(ClaimRequest), responses=ERRORS,
              summary="Claim GPUs: granted now, after waiting in the FIFO queue, or refused")
    async def claim(request: Request) -> Response:
        payload = await api.claim(request.headers.get("authorization"), await request.body(), request.is_disconnected)
        return _json(payload, 201)

    @app.get("/v1/leases", responses=ERRORS, summary="Live leases")
    async def leases(request: Request) -> Response:
        identify(request)
        status = await run_in_threadpool(pool.status)
        return _json({"leases": [lease.to_dict() for lease in status.leases]})

    @app.get("/v1/leases/{lease_id}", responses=ERRORS, summary="One live lease")
    async def get_lease(lease_id: str, request: Request) -> Response:
        identify(request)
        lease = await run_in_threadpool(pool.lease, lease_id)
        return _json(lease.to_dict())

    @app.post("/v1/leases/{lease_id}/heartbeat", responses=ERRORS, summary="Renew a lease by its TTL (holder or admin)")
    async def heartbeat(lease_id: str, request: Request) -> Response:
        return _json(api.heartbeat(request.headers.get("authorization"), lease_id))

    @app.delete("/v1/leases/{lease_id}", responses=ERRORS, summary="Release a lease (holder or admin)")
    async def release(lease_id: str, request: Request) -> Response:
        return _json(api.release(request.headers.get("authorization"), lease_id))

    # --- pool -----------------------------------------------------------------
    @app.get("/v1/status", responses=ERRORS, summary="Devices with their allocation, live leases, queue length")
    async def status(request: Request) -> Response:
        identify(request)
        return _json((await run_in_threadpool(pool.status)).to_dict())

    @app.get("/v1/devices", responses=ERRORS, summary="Devices with their allocated MiB")
    async def devices(request: Request) -> Response:
        identify(request)
        return _json({"devices": (await run_in_threadpool(pool.status)).to_dict()["devices"]})

    @app.post("/v1/tokens", status_code=201, openapi_extra=body_schema(TokenRequest), responses=ERRORS,
              summary="Create or rotate a named token (admin only)")
    async def tokens(request: Request) -> Response:
        identity = identify(request)
        require_admin(identity, "creating tokens")
        body = json_object(await request.body())
        unknown = set(body) - {"name", "admin"}
        if unknown:
            raise InvalidInput(f"unknown field(s) {sorted(unknown)}: a token request has 'name' and 'admin'")
        admin = body.get("admin", False)
        if not isinstance(admin, bool):
            raise InvalidInput(f"admin {admin!r} must be true or false")
        name = check_name(body.get("name"))
        token = await run_in_threadpool(create_token, pool.store, name, admin)
        if auth is not None:
            auth.forget()
        return _json({"name": name, "token": token}, 201)

    # --- operations -----------------------------------------------------------
    @app.get("/healthz", summary="Liveness (no auth)")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/metrics", summary="Prometheus metrics (no auth)")
    async def prometheus() -> Response:
        body = await run_in_threadpool(metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    _document_components(app)
    app.state.api = api
    return FastPath(app, api) if fast_path else app  # type: ignore[return-value]


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status_code=status, media_type="application/json")


def _document_components(app: FastAPI) -> None:
    """Add the body models to the OpenAPI components (bodies are parsed by hand)."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> Dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(component_schemas())
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


