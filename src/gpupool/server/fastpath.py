"""A thin ASGI layer that answers the hot lease calls before FastAPI's routing.

claim, heartbeat and release are most of a busy pool's traffic; answering
them here skips routing, dependency solving and Response objects (about half
the CPU of a request on a small machine). The FastAPI routes of the same
paths stay for the OpenAPI document and run the same `LeaseApi` code.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from ..core.errors import GpupoolError, InvalidInput
from .handlers import LeaseApi, dumps

log = logging.getLogger(__name__)

ASGIApp = Callable[..., Awaitable[None]]
PREFIX = "/v1/leases"
MAX_BODY = 1 << 20
_JSON_HEADERS = [(b"content-type", b"application/json")]


class FastPath:
    """Wraps `app`; serves POST /v1/leases, POST /v1/leases/{id}/heartbeat, DELETE /v1/leases/{id}."""

    def __init__(self, app: ASGIApp, api: LeaseApi) -> None:
        self.app = app
        self.api = api

    def __getattr__(self, name: str) -> Any:
        # Look like the wrapped FastAPI app (state, routes, openapi ...) to everyone else.
        return getattr(self.app, name)

    async def __call__(self, scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            route = _route(scope["method"], scope["path"])
            if route is not None:
                await self._serve(route, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(self, route: Tuple[str, str], scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        verb, lease_id = route
        authorization = _header(scope, b"authorization")
        status = 200
        try:
            if verb == "claim":
                raw, disconnected = await _read_body(receive)
                payload = await self.api.claim(authorization, raw, disconnected)
                status = 201
            elif verb == "heartbeat":
                payload = self.api.heartbeat(authorization, lease_id)
            else:
                payload = self.api.release(authorization, lease_id)
        except GpupoolError as err:
            status, payload = err.http_status, err.to_dict()
        except Exception as err:  # never a bare 500 without the JSON shape
            log.error("internal error", exc_info=err)
            status, payload = 500, {"error": {"code": "internal", "message": f"internal error: {err}"}}
        body = dumps(payload)
        headers = _JSON_HEADERS + [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _route(method: str, path: str) -> Optional[Tuple[str, str]]:
    if not path.startswith(PREFIX):
        return None
    rest = path[len(PREFIX):]
    if method == "POST" and rest in ("", "/"):
        return ("claim", "")
    if not rest.startswith("/") or len(rest) < 2:
        return None
    parts = rest[1:].split("/")
    if method == "DELETE" and len(parts) == 1:
        return ("release", parts[0])
    if method == "POST" and len(parts) == 2 and parts[1] == "heartbeat" and parts[0]:
        return ("heartbeat", parts[0])
    return None


def _header(scope: Dict[str, Any], name: bytes) -> Optional[str]:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


async def _read_body(receive: Callable) -> Tuple[bytes, Callable[[], Awaitable[bool]]]:
    chunks: List[bytes] = []
    more = True
    gone = False
    size = 0
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone = True
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
        size += len(chunks[-1])
        if size > MAX_BODY:
            raise InvalidInput(f"the request body is over {MAX_BODY} bytes: a claim is a small JSON object")

    async def disconnected() -> bool:
        # After the body, the next receive() only ever says http.disconnect; poll it without waiting.
        nonlocal gone
        if gone:
            return True
        try:
            message = await asyncio.wait_for(receive(), timeout=0.0001)
        except asyncio.TimeoutError:
            return False
        gone = message.get("type") == "http.disconnect"
        return gone

    return b"".join(chunks), disconnected
