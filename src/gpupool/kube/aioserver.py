"""A small HTTP/1.1 server on one asyncio event loop (uvloop when installed), with TLS.

The webhook answers small JSON POSTs from a few keep-alive clients (the API
server, the scheduler). A thread per connection (ThreadingHTTPServer) spent
its time in GIL hand-offs and `http.server`'s header parsing: at 32 clients
p99 was 65 ms. Here one loop thread reads each request, calls the app inline
(its answers are pure CPU, well under a millisecond) and writes the response
in one send. Only what the webhook needs of HTTP/1.1: Content-Length bodies,
keep-alive, `Connection: close`, `Expect: 100-continue`; anything else gets
a 4xx and the connection is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import threading
from typing import Any, Callable, Optional, Tuple, cast

log = logging.getLogger(__name__)

Handler = Callable[[str, str, bytes], Tuple[int, Any]]
MAX_HEAD = 64 * 1024
IDLE_TIMEOUT_S = 120.0  # idle keep-alive connections end after this
HANDSHAKE_TIMEOUT_S = 10.0  # a client that never finishes its TLS handshake is dropped
_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    411: b"Length Required",
    413: b"Payload Too Large",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
}


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # optional: about a third less CPU per request than asyncio's own loop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop comes with the server extra
        return asyncio.new_event_loop()


def response(status: int, answer: Any, keep_alive: bool = True) -> bytes:
    body = json.dumps(answer, separators=(",", ":")).encode()
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\nServer: gpupool-webhook\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            % (status, _REASONS.get(status, b"Status"), len(body)),
            b"" if keep_alive else b"Connection: close\r\n",
            b"\r\n",
            body,
        )
    )


def _error(status: int, message: str) -> bytes:
    return response(status, {"error": {"code": "invalid_input", "message": message}}, keep_alive=False)


class _Connection(asyncio.Protocol):
    """One client connection: parse requests as bytes arrive, answer each in order."""

    def __init__(self, handler: Handler, max_body: int, loop: asyncio.AbstractEventLoop) -> None:
        self.handler = handler
        self.max_body = max_body
        self.loop = loop
        self.buffer = bytearray()
        self.transport: Optional[asyncio.Transport] = None
        self.idle: Optional[asyncio.TimerHandle] = None
        self.continued = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's transports (plain or TLS) are full Transports; the Protocol API types the base.
        self.transport = cast(asyncio.Transport, transport)
        self._arm()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.idle is not None:
            self.idle.cancel()
        self.transport = None

    def _arm(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
        self.idle = self.loop.call_later(IDLE_TIMEOUT_S, self._timeout)

    def _timeout(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _fail(self, status: int, message: str) -> None:
        assert self.transport is not None
        self.transport.write(_error(status, message))
        self.transport.close()
        self.buffer.clear()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and not self.transport.is_closing():
            buf = self.buffer
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._fail(431, f"request head over {MAX_HEAD} bytes")
                return
            try:
                lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
                method, target, version = lines[0].split(" ")
            except ValueError:
                self._fail(400, "malformed request line")
                return
            length = 0
            keep_alive = version == "HTTP/1.1"
            expect = False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    try:
                        length = int(value)
                    except ValueError:
                        self._fail(400, f"bad Content-Length {value.strip()!r}")
                        return
                elif name == "connection":
                    tokens = value.lower()
                    if "close" in tokens:
                        keep_alive = False
                    elif "keep-alive" in tokens:
                        keep_alive = True
                elif name == "transfer-encoding":
                    self._fail(411, "send the body with a Content-Length, not chunked")
                    return
                elif name == "expect" and value.strip().lower() == "100-continue":
                    expect = True
            if length < 0 or length > self.max_body:
                self._fail(413, f"body over {self.max_body} bytes")
                return
            total = end + 4 + length
            if len(buf) < total:
                if expect and not self.continued:
                    self.continued = True
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            body = bytes(buf[end + 4 : total])
            del buf[:total]
            self.continued = False
            try:
                status, answer = self.handler(method, target, body)
                out = response(status, answer, keep_alive)
            except Exception as err:  # never a bare 500 without the JSON shape
                log.exception("internal error")
                out = response(500, {"error": {"code": "internal", "message": f"internal error: {err}"}}, False)
                keep_alive = False
            self.transport.write(out)
            if not keep_alive:
                self.transport.close()
                return
            self._arm()


class AsyncServer:
    """The server, running its loop in a daemon thread; `server_address` and `shutdown()` as socketserver's."""

    def __init__(
        self,
        address: Tuple[str, int],
        handler: Handler,
        ssl_context: Optional[Callable[[], ssl.SSLContext]],
        max_body: int,
    ) -> None:
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.socket.listen(1024)
        self.server_address = self.socket.getsockname()
        self.loop = new_loop()
        self._handler = handler
        self._ssl_context = ssl_context
        self._max_body = max_body
        self._server: Optional[asyncio.AbstractServer] = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpupool-webhook", daemon=True)

    def start(self) -> AsyncServer:
        self._thread.start()
        self._started.wait(10.0)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        context = self._ssl_context() if self._ssl_context else None

        def factory() -> _Connection:
            if self._ssl_context is not None:
                self._ssl_context()  # picks up a rotated certificate in place (see CertReloader)
            return _Connection(self._handler, self._max_body, self.loop)

        self._server = self.loop.run_until_complete(
            self.loop.create_server(
                factory,
                sock=self.socket,
                ssl=context,
                backlog=1024,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if context else None,  # only valid with ssl
            )
        )
        self._started.set()
        try:
            self.loop.run_forever()
        finally:
            self._server.close()
            self.loop.close()

    def shutdown(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)

    def server_close(self) -> None:
        self.shutdown()
