"""The webhook's HTTP server: a `Handler` served on the one listener of gpupool (`server.listener`).

The webhook answers small JSON POSTs from a few keep-alive clients (the API server, the
scheduler), so the handler is called inline from a plain ASGI callable: its answers are
pure CPU, well under a millisecond. The listener holds it to the bounds every gpupool
listener has (connections, head size and time, body size and time, bodies in flight);
this module adds the webhook's own: bodies up to MAX_BODY (an AdmissionReview of a big
pod), BODY_BUDGET of them being read at once, and a POST must say its Content-Length
(411). Every error answer closes the connection. The TLS certificate is re-read when its
files change.
"""

from __future__ import annotations

import json
import logging
import ssl
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ..serving.server import listener
from ..serving.server.bounds import Bounded
from ..serving.server.listener import Receive, Scope, Send
from ..serving.server.wire import internal_error

log = logging.getLogger(__name__)

Handler = Callable[[str, str, bytes], Tuple[int, Any]]

MAX_BODY = 8 * 1024 * 1024  # the API server's own request limit is about 3 MiB
# Bodies being read at once, over all connections: the listener's BODY_BUDGET (16 MiB) holds two
# reviews of MAX_BODY or hundreds of common ones (tens of KiB); each stalled one costs its TLS
# connection's buffers too (up to about 1 MiB), so more would let strangers hold more.
BODY_BUDGET = listener.BODY_BUDGET


class Limits(listener.Limits):
    """The listener's bounds with the webhook's body sizes."""

    def __init__(
        self,
        max_body: int = MAX_BODY,
        budget: int = BODY_BUDGET,
        body_timeout_s: Optional[float] = None,
        head_timeout_s: Optional[float] = None,
    ) -> None:
        super().__init__(max_body, budget, body_timeout_s, head_timeout_s)


def encode(answer: Any) -> Tuple[bytes, bytes]:
    """(body, content type) of a handler's answer: JSON data, or an object with `body` bytes
    and a `content_type` (e.g. Prometheus text)."""
    body = getattr(answer, "body", None)
    if isinstance(body, bytes):
        return body, str(getattr(answer, "content_type", "text/plain; charset=utf-8")).encode()
    return json.dumps(answer, separators=(",", ":")).encode(), b"application/json"


def _error(status: int, code: str, message: str) -> Tuple[int, Dict[str, Any]]:
    return status, {"error": {"code": code, "message": message}}


class WebhookASGI:
    """The ASGI face of a `Handler` (behind `Bounded`, which has read the body): one answer."""

    def __init__(self, handler: Handler, on_request: Callable[[], None] = lambda: None):
        self.handler = handler
        self.on_request = on_request  # e.g. the certificate reloader's cheap check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off; nothing else is served
            return
        self.on_request()
        method, path = scope["method"], scope["path"]
        query = scope.get("query_string") or b""
        target = path + ("?" + query.decode("latin-1") if query else "")
        if method in ("POST", "PUT", "PATCH") and not any(n == b"content-length" for n, _ in scope["headers"]):
            await self._send(send, *_error(411, "invalid_input", f"a {method} needs a Content-Length"), close=True)
            return
        message = await receive()
        body = message.get("body", b"") if message["type"] == "http.request" else b""
        try:
            status, answer = self.handler(method, target, body)
        except Exception as err:  # a bug: the traceback to the log under a request id, never to the client
            request_id, payload = internal_error(err, method, path)
            await self._send(send, 500, payload, close=True, extra=[(b"x-request-id", request_id.encode())])
            return
        await self._send(send, status, answer, close=status >= 400)

    @staticmethod
    async def _send(
        send: Send, status: int, answer: Any, close: bool, extra: Sequence[Tuple[bytes, bytes]] = ()
    ) -> None:
        body, content_type = encode(answer)
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class WebServer:
    """`handler` served from a daemon thread; `server_address` and `shutdown()` as socketserver's.
    `ssl_context` is called for each request: it may reload the certificate in place
    (admission.CertReloader)."""

    def __init__(
        self,
        address: Tuple[str, int],
        handler: Handler,
        ssl_context: Optional[Callable[[], ssl.SSLContext]] = None,
        limits: Optional[Limits] = None,
        head_timeout_s: Optional[float] = None,
    ) -> None:
        self.limits = limits or Limits()
        if head_timeout_s is not None:
            self.limits.head_timeout_s = head_timeout_s
        reload = ssl_context

        def on_request() -> None:
            if reload is not None:
                reload()  # re-reads the certificate files when they changed (checked at most every 10 s)

        sock = listener.bind(*address)
        app = Bounded(WebhookASGI(handler, on_request), self.limits)
        tls = ssl_context() if ssl_context is not None else None  # the one context, reloaded in place
        self._listener = listener.Listener(app, sock, self.limits, tls, name="gpupool-webhook")
        self.server_address = self._listener.server_address

    def start(self) -> WebServer:
        self._listener.start()
        return self

    def shutdown(self) -> None:
        self._listener.shutdown()

    def server_close(self) -> None:
        self.shutdown()
