"""The webhook's HTTP server: uvicorn (httptools' C parser, uvloop) with limits, in a thread.

The webhook answers small JSON POSTs from a few keep-alive clients (the API server, the
scheduler), so the app is called inline from a plain ASGI callable: its answers are pure CPU,
well under a millisecond. Around it, the limits a server on the cluster network needs:

- connections: at most MAX_CONNECTIONS (uvicorn answers more with 503);
- request head: complete within HEAD_TIMEOUT_S of its first byte (or of the connection), else
  the connection is closed (slow-header clients cannot hold connections);
- body: a Content-Length of at most MAX_BODY (413 at once, before any of it is read); chunked
  bodies get 411; the whole body within BODY_TIMEOUT_S (else 408); and all bodies being read
  at once within BODY_BUDGET bytes (else 503), so stalled uploads cannot pile up memory;
- malformed requests (a duplicate or negative Content-Length, a bad request line) get
  httptools' 400 and the connection is closed.

Every error answer closes the connection. The TLS certificate is re-read when its files change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import threading
from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional, Tuple

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

Handler = Callable[[str, str, bytes], Tuple[int, Any]]
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 8 * 1024 * 1024  # the API server's own request limit is about 3 MiB
BODY_BUDGET = 32 * 1024 * 1024  # bytes of request bodies being read at once, over all connections
MAX_CONNECTIONS = 512
HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 120.0  # idle keep-alive connections end after this (the API server keeps them)
_JSON = [(b"content-type", b"application/json")]


def encode(answer: Any) -> Tuple[bytes, bytes]:
    """(body, content type) of a handler's answer: JSON data, or an object with `body` bytes
    and a `content_type` (e.g. Prometheus text)."""
    body = getattr(answer, "body", None)
    if isinstance(body, bytes):
        return body, str(getattr(answer, "content_type", "text/plain; charset=utf-8")).encode()
    return json.dumps(answer, separators=(",", ":")).encode(), b"application/json"


def _error(status: int, code: str, message: str) -> Tuple[int, Dict[str, Any]]:
    return status, {"error": {"code": code, "message": message}}


class Limits:
    """The in-flight body budget, shared by every connection of one server (one event loop)."""

    def __init__(self, max_body: int = MAX_BODY, budget: int = BODY_BUDGET, body_timeout_s: float = BODY_TIMEOUT_S):
        self.max_body, self.budget, self.body_timeout_s = max_body, budget, body_timeout_s
        self.reading = 0


class WebhookASGI:
    """The ASGI face of a `Handler`: limits first, then the handler inline, one answer."""

    def __init__(
        self, handler: Handler, limits: Optional[Limits] = None, on_request: Callable[[], None] = lambda: None
    ):
        self.handler = handler
        self.limits = limits or Limits()
        self.on_request = on_request  # e.g. the certificate reloader's cheap check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off; nothing else is served
            return
        self.on_request()
        method, path = scope["method"], scope["path"]
        query = scope.get("query_string") or b""
        target = path + ("?" + query.decode("latin-1") if query else "")
        body, failure = await self._body(scope, receive)
        if failure is not None:
            await self._send(send, *failure, close=True)
            return
        try:
            status, answer = self.handler(method, target, body)
        except Exception as err:  # never a bare 500 without the JSON shape
            log.exception("internal error")
            await self._send(send, *_error(500, "internal", f"internal error: {err}"), close=True)
            return
        await self._send(send, status, answer, close=status >= 400)

    async def _body(self, scope: Scope, receive: Receive) -> Tuple[bytes, Optional[Tuple[int, Any]]]:
        length: Optional[int] = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = int(value)  # httptools has checked it: digits, one header
            elif name == b"transfer-encoding":
                return b"", _error(411, "invalid_input", "send the body with a Content-Length, not chunked")
        if length is None:
            if scope["method"] in ("POST", "PUT", "PATCH"):
                return b"", _error(411, "invalid_input", "a POST needs a Content-Length")
            return b"", None
        limits = self.limits
        if length > limits.max_body:
            return b"", _error(413, "too_large", f"body of {length} bytes is over {limits.max_body} bytes")
        if limits.reading + length > limits.budget:
            return b"", _error(503, "unavailable", "too many request bodies in flight; retry shortly")
        limits.reading += length
        try:
            # Usually the whole body came with the head: no timer for that (a task less per request).
            first = await receive()
            if first["type"] == "http.disconnect":
                return b"", None
            if not first.get("more_body"):
                return first.get("body", b""), None
            rest = await asyncio.wait_for(self._read(receive), limits.body_timeout_s)
            return first.get("body", b"") + rest, None
        except asyncio.TimeoutError:
            return b"", _error(408, "timeout", f"the body did not arrive within {limits.body_timeout_s:g} s")
        finally:
            limits.reading -= length

    @staticmethod
    async def _read(receive: Receive) -> bytes:
        chunks: List[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b""
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    async def _send(send: Send, status: int, answer: Any, close: bool) -> None:
        body, content_type = encode(answer)
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _Coalesced:
    """A transport whose writes within one loop iteration leave as one: uvicorn writes a
    response's head and body apart, and over TLS each write is a record of its own (about a
    third of the server's time per answer). Everything else goes to the real transport."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: List[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request head, and one write per answer."""

    head_timeout_s = HEAD_TIMEOUT_S
    _head: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Coalesced(transport, self.loop))  # type: ignore[arg-type]
        self._arm_head()  # a client that connects and never sends a whole head

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head()

    def on_headers_complete(self) -> None:
        self._cancel_head()
        super().on_headers_complete()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel_head()
        super().connection_lost(exc)

    def _arm_head(self) -> None:
        self._cancel_head()
        self._head = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _cancel_head(self) -> None:
        if self._head is not None:
            self._head.cancel()
            self._head = None

    def _head_late(self) -> None:
        self._head = None
        if self.transport is not None and not self.transport.is_closing():
            log.info("closing a connection whose request head took over %g s", self.head_timeout_s)
            self.transport.close()


class WebServer:
    """uvicorn serving `handler` from a daemon thread; `server_address` and `shutdown()` as
    socketserver's. `ssl_context` is called for each request: it may reload the certificate
    in place (admission.CertReloader)."""

    def __init__(
        self,
        address: Tuple[str, int],
        handler: Handler,
        ssl_context: Optional[Callable[[], ssl.SSLContext]] = None,
        limits: Optional[Limits] = None,
        head_timeout_s: float = HEAD_TIMEOUT_S,
    ) -> None:
        import uvicorn

        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.socket.listen(1024)
        self.server_address = self.socket.getsockname()
        reload = ssl_context

        def on_request() -> None:
            if reload is not None:
                reload()  # re-reads the certificate files when they changed (checked at most every 10 s)

        app = WebhookASGI(handler, limits, on_request)
        config = uvicorn.Config(
            app,
            http=type("LimitedProtocol", (_LimitedProtocol,), {"head_timeout_s": head_timeout_s}),
            loop="uvloop",
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
            date_header=False,
            proxy_headers=False,
            limit_concurrency=MAX_CONNECTIONS,
            timeout_keep_alive=int(IDLE_TIMEOUT_S),
            backlog=1024,
        )
        config.load()
        if ssl_context is not None:
            config.ssl = ssl_context()  # the one context, reloaded in place
        self._server = uvicorn.Server(config)
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpupool-webhook", daemon=True)

    def start(self) -> WebServer:
        self._thread.start()
        if not self._started.wait(10.0):
            raise RuntimeError("the webhook server did not start within 10 s")
        return self

    def _run(self) -> None:
        loop: asyncio.AbstractEventLoop
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop comes with the server extra
            loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def serve() -> None:
            task = asyncio.ensure_future(self._server.serve(sockets=[self.socket]))
            while not self._server.started and not task.done():
                await asyncio.sleep(0.005)
            self._started.set()
            await task

        try:
            loop.run_until_complete(serve())
        finally:
            self._started.set()
            loop.close()

    def shutdown(self) -> None:
        self._server.should_exit = True
        self._thread.join(10.0)

    def server_close(self) -> None:
        self.shutdown()
