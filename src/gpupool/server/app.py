"""`create_app(pool, auth=...)`: the FastAPI app of the /v1 API, /healthz and /metrics.

The routes live in `routes` (routers with an auth dependency); this module
assembles them with the error handlers, the expiry loop and the OpenAPI
document. Request bodies are parsed with the core model's `from_dict`, so HTTP
and the store share one wire format and one set of error messages.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Dict, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..core.errors import GpupoolError, InvalidInput
from ..pool import DEFAULT_TTL_S, Pool
from .auth import Authenticator
from .handlers import LeaseApi
from .metrics import Metrics
from .routes import ROUTERS
from .schemas import component_schemas
from .wire import internal_error

log = logging.getLogger(__name__)


def create_app(
    pool: Pool,
    auth: Optional[Authenticator] = None,
    *,
    default_ttl_s: float = DEFAULT_TTL_S,
    expire_interval_s: float = 1.0,
    title: str = "gpupool",
) -> FastAPI:
    """The API app over `pool`; `auth` None serves without tokens (loopback only, see serve)."""
    metrics = Metrics(pool)
    app = FastAPI(
        title=title,
        version=__version__,
        description="Pool GPUs and share them fractionally. Send `Authorization: Bearer <token>` on /v1.",
        lifespan=_expiry(pool, metrics, expire_interval_s),
    )
    app.state.api = LeaseApi(pool, auth, metrics, default_ttl_s)  # what the routes' dependencies hand out
    for router in ROUTERS:
        app.include_router(router)
    _add_error_handlers(app)
    app.openapi = _openapi(app)  # type: ignore[method-assign]  # FastAPI's documented way to extend the document
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
    async def http_error(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        return JSONResponse(
            {"error": {"code": code, "message": str(err.detail)}}, status_code=err.status_code, headers=err.headers
        )

    @app.exception_handler(Exception)
    async def internal(request: Request, err: Exception) -> JSONResponse:
        request_id, body = internal_error(err, request.method, request.url.path)
        return JSONResponse(body, status_code=500, headers={"x-request-id": request_id})


def _openapi(app: FastAPI) -> Callable[[], Dict[str, Any]]:
    """The OpenAPI document plus the body models (bodies are parsed by hand) and the bearer scheme."""

    def openapi() -> Dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(component_schemas())
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
