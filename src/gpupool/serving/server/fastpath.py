"""The one seam where the server leaves FastAPI: claim, heartbeat and release answered before its routing.

Why it exists: on the 2-core reference machine the plain FastAPI routes cost
about 0.2 ms of server CPU per lease call (routing, dependency solving), and a
pool with 16 busy clients then misses P1 (p99 < 10 ms per claim+release); see
docs/guides/server.md and `benchmarks/results/pool.json` ("http" with
the fast path, "http_plain" without; rendered in docs/benchmarks.md).

What it is: a plain ASGI wrapper (nothing beyond the ASGI spec) that answers
the three hot calls, at the methods and paths of their entries in the operation
table (`core.operations`: CLAIM, HEARTBEAT, RELEASE), as the routes answer them (the claim and the
release with the same `LeaseApi`, the heartbeat as its entry says: `operations.invoke`), the same
auth (`LeaseApi.identify`) and the same validation of a claim (`models.ClaimRequest`,
in `LeaseApi.claim`); everything else, the OpenAPI document included,
goes to the FastAPI app. It is applied in one place, `serve._app`,
when `ServerConfig.fast_path` is on (default; env `GPUPOOL_FAST_PATH=0` turns
it off), so `create_app` and the in-process tests see the framework alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    MutableMapping,
    Optional,
    Tuple,
)

from ...core.errors import Forbidden, GpupoolError, Unauthorized
from ...core.operations import CLAIM, HEARTBEAT, RELEASE, invoke
from .auth import Identity
from .wire import check_size, internal_error

if (
    TYPE_CHECKING
):  # at run time the app hands its LeaseApi in: importing it here would load prometheus for every ServerConfig
    from .handlers import LeaseApi

log = logging.getLogger(__name__)

ENV = "GPUPOOL_FAST_PATH"
# The hot calls, their methods and paths as the operation table declares them: (method, the
# path's segments with None where the table names an argument, the verb).
_HOT = tuple(
    (op.method, tuple(None if part.startswith("{") else part for part in op.path.split("/")), op.name)
    for op in (CLAIM, HEARTBEAT, RELEASE)
)
_JSON_HEADERS = [(b"content-type", b"application/json")]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def enabled_by_env() -> bool:
    """The default of `ServerConfig.fast_path`: on, unless env GPUPOOL_FAST_PATH is 0/false/off/no."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


class FastPath:
    """Wraps `app`; serves POST /v1/leases, POST /v1/leases/{id}/heartbeat, DELETE /v1/leases/{id}."""

    def __init__(self, app: ASGIApp, api: LeaseApi) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            route = _route(scope["method"], scope["path"])
            if route is not None:
                await self._serve(route, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(self, route: Tuple[str, str], scope: Scope, receive: Receive, send: Send) -> None:
        verb, lease_id = route
        status = 200
        payload: Dict[str, Any]
        extra: List[Tuple[bytes, bytes]] = []
        try:
            identity = self._identify(scope, counts_claim=verb == "claim")
            if verb == "claim":
                raw, disconnected = await _read_body(receive)
                payload = await self.api.claim(identity, raw, disconnected)
                status = 201
            elif verb == "heartbeat":  # as its generated route answers it (operation_routes)
                args = {"lease_id": lease_id}
                payload = HEARTBEAT.to_wire(
                    invoke(self.api.pool, HEARTBEAT, args, identity.requester, identity.name), args
                )
            else:
                raw, _ = await _read_body(receive)
                payload = self.api.release(identity, lease_id, raw)
        except GpupoolError as err:
            status, payload = err.http_status, err.to_dict()
        except Exception as err:  # a bug: logged with a request id, never a traceback to the client
            request_id, payload = internal_error(err, scope["method"], scope["path"])
            status = 500
            extra = [(b"x-request-id", request_id.encode())]
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = _JSON_HEADERS + extra + [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _identify(self, scope: Scope, counts_claim: bool) -> Identity:
        # The same rule as routes.caller / routes.claimer, on the raw ASGI headers.
        try:
            return self.api.identify(_header(scope, b"authorization"))
        except (Unauthorized, Forbidden):
            if counts_claim:
                self.api.claim_denied()
            raise


def _route(method: str, path: str) -> Optional[Tuple[str, str]]:
    """(verb, lease id) of a hot call, or None for everything the FastAPI app serves."""
    parts = path.split("/")
    trailing = len(parts) > 2 and parts[-1] == ""  # "/v1/leases/": the claim's path alone takes one
    if trailing:
        parts.pop()
    for hot_method, template, verb in _HOT:
        if method != hot_method or len(parts) != len(template) or (trailing and None in template):
            continue
        given = ""
        for part, expected in zip(parts, template):
            if expected is None and part:
                given = part
            elif part != expected:
                break
        else:
            return (verb, given)
    return None


def _header(scope: Scope, name: bytes) -> Optional[str]:
    for key, value in scope.get("headers", ()):
        if key == name:
            decoded: str = value.decode("latin-1")
            return decoded
    return None


async def _read_body(receive: Receive) -> Tuple[bytes, Callable[[], Awaitable[bool]]]:
    """The whole request body, and a check whether the client has gone since."""
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
        check_size(size)

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
