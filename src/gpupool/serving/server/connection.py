"""One HTTP connection held to its bounds: the head's size and time, and the connection count.

uvicorn's httptools protocol has no bound on a request head's size or time (a client may
stream one header line for ever). `Guarded` wraps whichever protocol uvicorn resolved,
by composition through asyncio's Protocol interface, and watches the bytes that arrive
while no request of the connection is being served (a head being received, or an idle
keep-alive connection): more than MAX_HEADER_BYTES of them is answered 431, more than
`head_timeout_s` of waiting closes the connection. The ASGI layer (`bounds.Bounded`)
says when a request's head was complete and when its answer was done, through
`Limits.request_started/ended`, the only place where a head's end is known without
parsing HTTP a second time.

Writes within one loop iteration leave as one (`_Coalesced`): uvicorn writes a response's
head and body apart, and over TLS each write is a record of its own. A connection whose
request body was refused unread (413) lingers before it closes (`Guarded.linger`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable, List, Optional, Tuple, Type, cast

from .listener import CLOSE_GRACE_S, LINGER_BYTES, LINGER_S, MAX_HEADER_BYTES, Limits

log = logging.getLogger(__name__)


def _answer(status: int, reason: str, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 error answer in the project's error shape, closing the connection."""
    body = json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


HEAD_TOO_LARGE = _answer(
    431,
    "Request Header Fields Too Large",
    "too_large",
    f"the request head is over {MAX_HEADER_BYTES} bytes: send fewer or shorter headers",
)


class _Coalesced:
    """A transport whose writes within one loop iteration leave as one; the rest is the real one's."""

    __slots__ = ("_transport", "_loop", "_pending", "_on_close", "_closed", "lingering")

    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, on_close: Callable[[], None]
    ) -> None:
        self._transport, self._loop, self._on_close = transport, loop, on_close
        self._pending: List[bytes] = []
        self._closed = False
        self.lingering = False  # close() sends the answer and goes on reading (Guarded.linger)

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
        self._closed = True
        if not self.lingering:
            self._transport.close()
        self._on_close()

    def is_closing(self) -> bool:
        """Closed for the inner protocol, also while the connection lingers (it writes nothing more)."""
        return self._closed or self._transport.is_closing()

    def detach(self) -> None:
        """After connection_lost: let go of the transport (and its TLS buffers) at once.

        The inner protocol is in a reference cycle with its parser, which only the
        collector's slow generations break; the transport must not wait for that.
        """
        self._pending.clear()
        self._transport = _Gone()  # type: ignore[assignment]
        self._on_close = _nothing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _nothing() -> None:
    pass


class _Gone:
    """A transport after connection_lost: closing, writes dropped."""

    def is_closing(self) -> bool:
        return True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class Guarded(asyncio.Protocol):
    """The wrapped protocol of one connection, with its head bounds (see the module's text)."""

    inner_class: Type[asyncio.Protocol]
    limits: Limits

    def __init__(self, **kwargs: Any) -> None:
        self.inner: Any = self.inner_class(**kwargs)
        self.loop = asyncio.get_running_loop()
        self.transport: Optional[asyncio.Transport] = None
        self.peer: Optional[Tuple[str, int]] = None
        self.serving = False  # a request of this connection is being served
        self.head_bytes = 0  # bytes received since the last answer (or the connection)
        self._timer: Optional[asyncio.TimerHandle] = None
        self._size_check = False
        self._inner_made = False
        self._abort: Optional[asyncio.TimerHandle] = None  # set once the connection is closing
        self._lingering = False  # closing after a refused body: what still arrives is read and dropped
        self._dropped = 0  # bytes dropped while lingering

    # -- asyncio.Protocol, passed on to the inner protocol -------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self.transport = transport
        limits = self.limits
        if len(limits.connections) >= limits.max_connections:
            transport.write(
                _answer(
                    503,
                    "Service Unavailable",
                    "unavailable",
                    f"over {limits.max_connections} connections; retry shortly",
                )
            )
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        if isinstance(peer, (tuple, list)) and len(peer) >= 2:  # the key uvicorn's scope["client"] has
            self.peer = (str(peer[0]), int(peer[1]))
            limits.connections[self.peer] = self
        self._arm()
        self._inner_made = True
        self._coalesced = _Coalesced(transport, self.loop, self._closing)
        self.inner.connection_made(self._coalesced)

    def data_received(self, data: bytes) -> None:
        if not self._inner_made or self._abort is not None:  # what a closing connection still sends is dropped
            if self._lingering:
                self._dropped += len(data)
                if self._dropped > LINGER_BYTES and self.transport is not None:
                    self.transport.abort()
            return
        if not self.serving:
            self.head_bytes += len(data)
        self.inner.data_received(data)
        if not self.serving and self.head_bytes > MAX_HEADER_BYTES and not self._size_check:
            # A complete head starts its request in a task that runs before this check
            # (FIFO): only a head still incomplete after this much is refused.
            self._size_check = True
            self.loop.call_soon(self._check_size)

    def eof_received(self) -> Optional[bool]:
        if not self._inner_made or self._lingering:  # lingering: the client is done, the transport closes
            return None
        result: Optional[bool] = self.inner.eof_received()
        return result

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel()
        if self._abort is not None:
            self._abort.cancel()
        if self.peer is not None and self.limits.connections.get(self.peer) is self:
            del self.limits.connections[self.peer]
        self.limits.heap.connection_closed(self.loop)
        if self._inner_made:
            self.inner.connection_lost(exc)
            self._coalesced.detach()
        self.transport = None
        self._abort = self._timer = None

    def pause_writing(self) -> None:
        if self._inner_made:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner_made:
            self.inner.resume_writing()

    # -- told by the ASGI layer ------------------------------------------------------------
    def linger(self) -> None:
        """The request's body is refused unread (413): the close that follows the answer reads and
        drops the rest of it first. Closing at once, with those bytes unread, makes the kernel
        reset the connection, and a client still sending gets the reset instead of the answer.
        Plain TCP sends the answer and a FIN at once (a half-close); either way the connection
        ends when the client closes, after LINGER_BYTES or after LINGER_S."""
        if self._inner_made:
            self._coalesced.lingering = True
            self._lingering = True

    def request_started(self) -> None:
        self.serving = True
        self._cancel()

    def request_ended(self) -> None:
        self.serving = False
        self.head_bytes = 0
        self._arm()

    # -- the bounds ----------------------------------------------------------------------------
    def _check_size(self) -> None:
        self._size_check = False
        if not self.serving and self.head_bytes > MAX_HEADER_BYTES and self.transport is not None:
            log.info("refusing a request head of over %d bytes from %s", MAX_HEADER_BYTES, self.peer)
            self._close(HEAD_TOO_LARGE)

    def _arm(self) -> None:
        self._cancel()
        self._timer = self.loop.call_later(self.limits.head_timeout_s, self._late)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        self._timer = None
        if not self.serving and self.transport is not None and not self.transport.is_closing():
            log.info("closing a connection idle or mid-head for %g s: %s", self.limits.head_timeout_s, self.peer)
            self._close(b"")

    def _close(self, answer: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if answer:
            transport.write(answer)
        transport.close()  # connection_lost follows, for the inner protocol too
        self._closing(cut=True)

    def _closing(self, cut: bool = False) -> None:
        """The connection is closing: make sure it ends, whatever the peer does.

        Plain TCP closes once the answer is flushed, TLS once the peer's close_notify came;
        meanwhile TLS reads, decrypts and drops all the peer sends. A peer that never reads
        its answer, or keeps sending, is cut after CLOSE_GRACE_S; one `cut` here (a head
        flood over TLS, at hundreds of MiB/s) at the next turn of the loop: the answer is
        already in the socket (TLS writes through at once).
        """
        transport = self.transport
        if self._abort is None and transport is not None:
            if self._lingering and not transport.is_closing():
                if transport.can_write_eof():
                    transport.write_eof()  # after the answer: the client may read it while it still sends
                if not transport.is_reading():  # uvicorn pauses reading at 64 KiB of a body nobody reads
                    transport.resume_reading()
                self._abort = self.loop.call_later(LINGER_S, transport.abort)
                return
            tls = transport.get_extra_info("ssl_object") is not None
            self._abort = self.loop.call_later(0 if cut and tls else CLOSE_GRACE_S, transport.abort)


def guarded(inner_class: Type[asyncio.Protocol], limits: Limits) -> Type[Guarded]:
    """A protocol class for uvicorn's `Config(http=...)`: `inner_class` held to `limits`."""
    return type("Guarded", (Guarded,), {"inner_class": inner_class, "limits": limits})
