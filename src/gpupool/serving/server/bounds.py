"""The one body reader of every listener: an ASGI layer that reads each request's body within bounds.

Before the app sees a request: at most `Limits.max_in_flight` requests at once (503), a head
within MAX_HEADER_BYTES (431; `connection.Guarded` cuts off longer heads still arriving), no
chunked bodies (411: every client of gpupool sends a Content-Length), a Content-Length of
at most `max_body` (413) that fits the in-flight budget (503), and the whole body within
`body_timeout_s` (408). Each refusal is the project's error JSON and closes the
connection (after a 413, once the rest of the body is read and dropped: `listener.LINGER_S`).
The app then gets the body as one message.

The body grows in one buffer as it arrives rather than as a list of chunks joined at the
end: a stalled upload holds what it sent and nothing more (not its announced length),
and a big buffer lives in memory the allocator maps and unmaps whole, so a finished
one leaves no scattered chunks behind.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Dict, Optional, Tuple

from .listener import LINGER_BYTES, MAX_HEADER_BYTES, ASGIApp, Limits, Message, Receive, Scope, Send


def error_body(code: str, message: str) -> Dict[str, Any]:
    """The project's error shape (core.errors.GpupoolError.to_dict)."""
    return {"error": {"code": code, "message": message}}


async def send_error(send: Send, status: int, code: str, message: str) -> None:
    """An error answer that closes the connection."""
    body = json.dumps(error_body(code, message), separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Bounded:
    """Wraps an ASGI app: the limits above, then the app with the body already read."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits
        client = scope.get("client")
        limits.request_started(client)  # before any await: the connection's head timer stops
        try:
            if limits.in_flight >= limits.max_in_flight:
                await send_error(
                    send, 503, "unavailable", f"over {limits.max_in_flight} requests at once; retry shortly"
                )
                return
            limits.in_flight += 1
            try:
                await self._serve(scope, receive, send)
            finally:
                limits.in_flight -= 1
        finally:
            limits.request_ended(client)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        length, refusal = self._length(scope)
        if refusal is not None:
            if refusal[0] == 413 and length <= LINGER_BYTES:
                self.limits.linger(scope.get("client"))  # the answer, not a reset, reaches the client
            await send_error(send, *refusal)
            return
        if length == 0:  # no body (or an empty one): nothing to wait for
            await self.app(scope, receive, send)
            return
        limits = self.limits
        limits.reading += length
        try:
            body = await _within(_read(receive, length), limits.body_timeout_s)
        finally:
            limits.reading -= length
        if body is None:
            await send_error(
                send, 408, "timeout", f"the request body did not arrive within {limits.body_timeout_s:g} s"
            )
            return
        await self.app(scope, _Replay(bytes(body), receive), send)

    def _length(self, scope: Scope) -> Tuple[int, Optional[Tuple[int, str, str]]]:
        """The announced body length, or (status, code, message) of a refusal."""
        limits = self.limits
        length = 0
        # A head that came whole in one read passed the connection's running count: measure it here.
        head = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        for name, value in scope["headers"]:
            head += len(name) + len(value) + 4
            if name == b"content-length":
                length = int(value)  # h11 has checked it: digits, one value
            elif name == b"transfer-encoding":
                return 0, (411, "invalid_input", "send the body with a Content-Length, not chunked")
        if head > MAX_HEADER_BYTES:
            return 0, (
                431,
                "too_large",
                f"the request head is over {MAX_HEADER_BYTES} bytes: send fewer or shorter headers",
            )
        if length > limits.max_body:  # with the length: it decides whether the rest is read and dropped
            return length, (
                413,
                "too_large",
                f"the request body of {length} bytes is over {limits.max_body} bytes: send a smaller one",
            )
        if length and limits.reading + length > limits.budget:
            return 0, (503, "unavailable", "too many request bodies in flight; retry shortly")
        return length, None


async def _within(work: Awaitable[Optional[bytearray]], timeout_s: float) -> Optional[bytearray]:
    """`work`'s result, or None when it took over `timeout_s`.

    A timer that cancels this task, not asyncio.wait_for: that runs `work` in a task of
    its own, a cost on every request with a body (0.02 ms of the webhook's 0.15).
    """
    task = asyncio.current_task()
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(timeout_s, expire)
    try:
        return await work
    except asyncio.CancelledError:
        if not expired:  # cancelled from outside: the server is stopping
            raise
        uncancel = getattr(task, "uncancel", None)  # Python >= 3.11 counts cancellations
        if uncancel is not None:
            uncancel()
        return None
    finally:
        timer.cancel()


async def _read(receive: Receive, length: int) -> Optional[bytearray]:
    """The body, `length` bytes, in one growing buffer; None when the client left before sending it all."""
    buffer = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        buffer += message.get("body", b"")
        if len(buffer) > length:  # the parser stops at Content-Length; defensive all the same
            return None
        if not message.get("more_body"):
            return buffer if len(buffer) == length else None


class _Replay:
    """The app's receive: the whole body once, then the client's own (for http.disconnect)."""

    __slots__ = ("_body", "_receive")

    def __init__(self, body: bytes, receive: Receive) -> None:
        self._body: Optional[bytes] = body
        self._receive = receive

    async def __call__(self) -> Message:
        body = self._body
        if body is None:
            return await self._receive()
        self._body = None
        return {"type": "http.request", "body": body, "more_body": False}
