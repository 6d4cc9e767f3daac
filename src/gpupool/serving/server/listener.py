"""Every HTTP listener of gpupool (pool server, dashboard, node agent, webhook, extender) is built here.

One stack: uvicorn with httptools' C parser on uvloop (a measured choice: hypercorn, whose
public settings hold all the bounds below, cost 0.37 ms of server CPU per lease call
against 0.21 ms here, and missed P1). Around uvicorn,
through its public API only (`Config(http=<protocol class>)`, its ASGI app), the bounds
a server facing strangers needs:

- connections: at most MAX_CONNECTIONS (503 JSON, then closed);
- request head: at most MAX_HEADER_BYTES (431 JSON, closed), complete within
  HEAD_TIMEOUT_S of the connection or of the previous answer, else closed (the same
  timer ends idle keep-alive connections); see `connection.Guarded`;
- body: read by one ASGI layer (`bounds.Bounded`) for every request, authenticated or
  not: a Content-Length of at most the listener's `max_body` (413, after which what the
  client still sends is read and dropped, up to LINGER_BYTES within LINGER_S, so that it
  gets the answer rather than a reset), the whole body within BODY_TIMEOUT_S (408), all
  bodies being read at once within BODY_BUDGET (503), at most MAX_IN_FLIGHT requests at
  once (503); error answers close the connection;
- TLS 1.2 or later.

`bind` makes the listening socket (so a busy port fails before anything starts),
`run_forever` serves in the main thread until SIGTERM/SIGINT, `Listener` serves in a
thread of its own (the webhook, tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import ssl
import threading
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Literal, MutableMapping, Optional, Tuple

from ...core.errors import InvalidInput
from .heap import HeapTrimmer
from .wire import MAX_BODY_BYTES  # the pool API's bodies; the webhook passes its own

log = logging.getLogger(__name__)

DEFAULT_PORT = 56001
MAX_HEADER_BYTES = 16 * 1024  # a request line and its headers; ours are a few hundred bytes
HEAD_TIMEOUT_S = 30.0  # a request head (and an idle keep-alive connection) within this
MAX_CONNECTIONS = 1024
CLOSE_GRACE_S = 1.0  # a connection being closed (TLS close_notify, an unread answer) is cut after this
# After a 413 the client is still sending its body: a close with those bytes unread would reset the
# connection, and the reset can destroy the answer before the client reads it. So the rest of the
# body is read and dropped first, for at most LINGER_S and LINGER_BYTES (a body announced as longer
# than that is not waited for). See connection.Guarded.linger.
LINGER_S = 5.0
LINGER_BYTES = 64 * 1024 * 1024
BODY_TIMEOUT_S = 10.0  # a whole request body within this of its head
BODY_BUDGET = 16 * 1024 * 1024  # bytes of request bodies being read at once, over all connections
MAX_IN_FLIGHT = 512  # requests being served at once; more get 503
BACKLOG = 2048
# Env overrides of the two timers, in seconds (tests and operators behind slow links).
HEAD_TIMEOUT_ENV = "GPUPOOL_HTTP_HEAD_TIMEOUT"
BODY_TIMEOUT_ENV = "GPUPOOL_HTTP_BODY_TIMEOUT"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Lifespan = Literal["auto", "on", "off"]


def _seconds_from_env(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"{name}={text!r}: give a number of seconds, e.g. {default:g}") from None
    if not 0 < value <= 3600:
        raise InvalidInput(f"{name}={text!r}: give seconds between 0 and 3600, e.g. {default:g}")
    return value


class Limits:
    """The bounds of one listener, and its in-flight accounting (one event loop, so no lock)."""

    def __init__(
        self,
        max_body: int = MAX_BODY_BYTES,
        budget: int = BODY_BUDGET,
        body_timeout_s: Optional[float] = None,
        head_timeout_s: Optional[float] = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.max_body, self.budget, self.max_in_flight = max_body, budget, max_in_flight
        self.max_connections = max_connections
        self.body_timeout_s = body_timeout_s or _seconds_from_env(BODY_TIMEOUT_ENV, BODY_TIMEOUT_S)
        self.head_timeout_s = head_timeout_s or _seconds_from_env(HEAD_TIMEOUT_ENV, HEAD_TIMEOUT_S)
        self.reading = 0  # bytes of bodies being read now
        self.in_flight = 0  # requests being served now
        # The open connections by peer address: the ASGI layer (which sees only scope["client"])
        # tells a connection when its request head is complete and when its answer is done.
        self.connections: Dict[Tuple[str, int], Any] = {}
        self.heap = HeapTrimmer()  # what a burst of connections freed goes back to the kernel

    def request_started(self, client: Optional[Tuple[str, int]]) -> None:
        """The head of a request on `client`'s connection is complete: its head timer stops."""
        connection = self.connections.get(client) if client else None
        if connection is not None:
            connection.request_started()

    def request_ended(self, client: Optional[Tuple[str, int]]) -> None:
        """The answer on `client`'s connection is done: the next head's timer starts."""
        connection = self.connections.get(client) if client else None
        if connection is not None:
            connection.request_ended()

    def linger(self, client: Optional[Tuple[str, int]]) -> None:
        """The body of the request on `client`'s connection is refused unread: when the connection
        closes, it reads and drops what the client still sends (LINGER_S, LINGER_BYTES) first."""
        connection = self.connections.get(client) if client else None
        if connection is not None:
            connection.linger()


# -- the listening socket ---------------------------------------------------------------


def parse_listen(listen: str) -> Tuple[str, int]:
    """'0.0.0.0:56001', '[::1]:56001', ':56001' or 'host' -> (host, port)."""
    text = listen.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:  # a bare IPv6 address
        host, port_text = text, ""
    else:
        host, port_text = text, ""
    host = host or "0.0.0.0"
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise InvalidInput(f"--listen {listen!r}: the port must be a number, e.g. 0.0.0.0:{DEFAULT_PORT}") from None
    if not 0 <= port <= 65535:
        raise InvalidInput(f"--listen {listen!r}: port {port} is out of range")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether `host` (a --listen host) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); InvalidInput names the address when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only when the
    # listening socket says so, and without it every response waits 40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise InvalidInput(f"cannot listen on {host}:{port}: {err.strerror}; pick another --listen port") from None
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """The server side of TLS: 1.2 or later, HTTP/1.1."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile, keyfile)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


# -- serving ----------------------------------------------------------------------------


def _uvicorn_config(app: ASGIApp, limits: Limits, tls: Optional[ssl.SSLContext], lifespan: Lifespan) -> Any:
    import uvicorn

    from .connection import guarded

    def config(http: Any) -> Any:
        return uvicorn.Config(
            app,
            http=http,
            lifespan=lifespan,
            log_config=None,  # gpupool's logging, not uvicorn's
            access_log=False,  # one log line per request costs more than the request
            server_header=False,
            date_header=False,
            proxy_headers=False,  # nothing reads the client address as the client's word
            timeout_keep_alive=int(limits.head_timeout_s) or 1,
            backlog=BACKLOG,
        )

    # httptools (or h11 without it), as uvicorn resolves "auto", wrapped in the bounds above.
    probe = config("auto")
    probe.load()
    loaded = config(guarded(probe.http_protocol_class, limits))
    loaded.load()
    loaded.ssl = tls  # our context (TLS 1.2+; the webhook's is reloaded in place)
    return loaded


@contextlib.contextmanager
def _stop_signals_recorded() -> Iterator[List[int]]:
    """While uvicorn serves, SIGINT/SIGTERM found at the end are only recorded.

    uvicorn catches the signal, shuts down, restores the handler it found and raises
    the signal again; with the default handler that kills the process before any
    `finally` runs (state lock and pool left open, exit status 143). With this handler
    in place shutdown runs to the end and the process exits 0.
    """
    received: List[int] = []
    stops = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in stops}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_forever(
    app: ASGIApp, sock: socket.socket, limits: Limits, tls: Optional[ssl.SSLContext], lifespan: Lifespan = "on"
) -> List[int]:
    """Serve `app` on `sock` in the main thread until SIGTERM or SIGINT; the signals received."""
    import uvicorn

    server = uvicorn.Server(_uvicorn_config(app, limits, tls, lifespan))
    with _stop_signals_recorded() as received:
        server.run(sockets=[sock])
    return received


class Listener:
    """`app` served on `sock` from a daemon thread; `shutdown()` stops it and waits."""

    def __init__(
        self,
        app: ASGIApp,
        sock: socket.socket,
        limits: Limits,
        tls: Optional[ssl.SSLContext] = None,
        name: str = "gpupool-http",
        lifespan: Lifespan = "off",
    ) -> None:
        import uvicorn

        self.sock = sock
        self.server_address = sock.getsockname()
        self._server = uvicorn.Server(_uvicorn_config(app, limits, tls, lifespan))
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Listener:
        """Start serving; returns once the socket accepts (RuntimeError if not within 10 s)."""
        self._thread.start()
        if not self._started.wait(10.0) or not self._server.started:
            raise RuntimeError("the HTTP listener did not start within 10 s")
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
            task = asyncio.ensure_future(self._server.serve(sockets=[self.sock]))
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
        """Stop accepting, let requests in flight finish, close the socket."""
        self._server.should_exit = True
        self._thread.join(10.0)
        self.sock.close()
