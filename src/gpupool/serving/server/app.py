"""`create_app(pool, auth=...)`: the FastAPI app of the /v1 API, /healthz, /metrics and the dashboard at /.

The routes live in `routes` (routers with an auth dependency); this module
assembles them with the error handlers, the expiry loop and the OpenAPI
document. Request bodies are validated by the models of `models` (their JSON schemas are the
document's components) and become core types; answers are the core types' `to_dict`, the one
wire format of HTTP and the store.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Set

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ... import __version__
from ...core.errors import GpupoolError, InvalidInput
from ...pooling.pool import DEFAULT_TTL_S, Pool
from ..enforcement.attest import AttestKeys
from .auth import Authenticator
from .dashboard import install as install_dashboard
from .dashboard.routes import JobsReader
from .handlers import LeaseApi
from .metrics import Metrics
from .operation_routes import operation_routes
from .routes import ROUTERS
from .schemas import OPERATIONS, REQUEST_BODIES, component_schemas, request_body, responses
from .wire import internal_error

log = logging.getLogger(__name__)


def create_app(
    pool: Pool,
    auth: Optional[Authenticator] = None,
    *,
    default_ttl_s: float = DEFAULT_TTL_S,
    expire_interval_s: float = 1.0,
    title: str = "gpupool",
    jobs: Optional[JobsReader] = None,
) -> FastAPI:
    """The API app over `pool`; `auth` None serves without tokens (loopback only, see serve)."""
    metrics = Metrics(pool)
    app = FastAPI(
        title=title,
        version=__version__,
        description="Pool GPUs and share them fractionally."
        + (" Send `Authorization: Bearer <token>` on /v1." if auth is not None else " This server runs without auth."),
        lifespan=_expiry(pool, metrics, expire_interval_s),
    )
    # What the routes' dependencies hand out; claims are answered with their lease's attestation key.
    app.state.api = LeaseApi(pool, auth, metrics, default_ttl_s, AttestKeys(pool.state_dir))
    for router in (*ROUTERS, operation_routes):
        app.include_router(router)
    install_dashboard(app, jobs=jobs)  # the web dashboard at /: the same tokens, the same status record
    _add_error_handlers(app)
    app.openapi = _openapi(app, auth is not None)  # type: ignore[method-assign]  # FastAPI's documented way to extend the document
    return app


def _expiry(pool: Pool, metrics: Metrics, interval_s: float) -> Callable[[FastAPI], Any]:
    """The app's lifespan: a task that reclaims leases of dead clients even when nobody calls the API."""

    async def expire_forever() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                expired = await run_in_threadpool(pool.expire)
                if expired:
                    metrics.expired.inc(len(expired))
            except Exception:
                log.warning("expiry failed", exc_info=True)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(expire_forever())
        try:
            yield
        finally:
            task.cancel()

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Every failure answers {"error": {"code", "message"}}; bad input is a 4xx, never a 500."""

    @app.exception_handler(GpupoolError)
    async def gpupool_error(_request: Request, err: GpupoolError) -> JSONResponse:
        return JSONResponse(err.to_dict(), status_code=err.http_status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, err: RequestValidationError) -> JSONResponse:
        detail = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in err.errors())
        return JSONResponse(InvalidInput(f"bad request: {detail}").to_dict(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        headers = dict(err.headers or {})
        if err.status_code == 405:  # Starlette names the methods of one route; the path may have several
            headers["Allow"] = ", ".join(_allowed_methods(app, request))
        return JSONResponse(
            {"error": {"code": code, "message": str(err.detail)}}, status_code=err.status_code, headers=headers
        )

    @app.exception_handler(Exception)
    async def internal(request: Request, err: Exception) -> JSONResponse:
        request_id, body = internal_error(err, request.method, request.url.path)
        return JSONResponse(body, status_code=500, headers={"x-request-id": request_id})


def serves(app: FastAPI) -> Callable[[str, str], bool]:
    """served(method, path): whether a route of `app` takes `method` on `path`."""

    def served(method: str, path: str) -> bool:
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        return any(route.matches(scope)[0] is Match.FULL for route in app.router.routes)

    return served


def _allowed_methods(app: FastAPI, request: Request) -> List[str]:
    """Every method some route of `app` serves on the request's path."""
    methods: Set[str] = set()
    scope = dict(request.scope, method="GET")
    todo: List[Any] = list(app.router.routes)
    while todo:
        route = todo.pop()
        if route.matches(scope)[0] is Match.NONE:
            continue
        # an included router (FastAPI keeps it whole, as _IncludedRouter) or a mount
        nested = getattr(getattr(route, "original_router", route), "routes", None)
        if nested is not None and not getattr(route, "methods", None):
            todo.extend(nested)
        else:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


def _openapi(app: FastAPI, auth: bool) -> Callable[[], Dict[str, Any]]:
    """The OpenAPI document: exact bodies and answers (`schemas`), the bearer scheme only with auth."""

    def openapi() -> Dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(component_schemas())
            for path, operations in schema.get("paths", {}).items():
                for method, operation in operations.items():
                    if (path, method) in OPERATIONS:
                        operation["responses"] = responses(path, method, auth)
                    if (path, method) in REQUEST_BODIES:
                        operation["requestBody"] = request_body(REQUEST_BODIES[(path, method)])
                    if auth and path.startswith("/v1/"):
                        operation["security"] = [{"bearer": []}]
            if auth:
                components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
