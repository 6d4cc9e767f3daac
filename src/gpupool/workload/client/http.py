"""HTTP client of a pool server: keep-alive, bearer token, TLS with a CA file.

The transport is a small HTTP/1.1 client on a socket (`_Connection`) rather than http.client,
which imports email and ssl: `gpupool run` against a plain-HTTP pool imports neither, and
against HTTPS only ssl. It speaks what the pool API needs: one request at a time on a kept-alive
connection, JSON bodies with Content-Length, answers with Content-Length, chunked, or until
the server closes.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import urllib.parse
from typing import TYPE_CHECKING

from ...core import operations as ops
from ...core.attestation import AttestTicket
from ...core.errors import (
    GpupoolError,
    InvalidInput,
    ServerUnreachable,
    Unauthorized,
    error_for_status,
    error_from_dict,
)
from ...core.operations import Operation
from ...logs import get_logger
from .base import PoolClient
from .config import normalize_url

if TYPE_CHECKING:
    import ssl
    from typing import Any, Dict, List, Optional, Tuple, Type, TypeVar, Union

    A = TypeVar("A")

log = get_logger(__name__)

DEFAULT_TIMEOUT_S = 30.0
# Header lines and the status line are short; a longer one is not a pool server answering.
_MAX_LINE = 65536
_MAX_HEADERS = 100


class HttpProtocolError(OSError):
    """The server's answer is not HTTP/1.x as this client reads it."""


class Disconnected(ConnectionError):
    """The server closed the connection before it answered (a kept-alive connection gone idle)."""


# Failures that mean "the socket went away", where one fresh connection is worth a try.
_DROPPED = (Disconnected, ConnectionResetError, BrokenPipeError)


class HttpPoolClient(PoolClient):
    """One pool server over HTTP(S), one kept-alive connection, safe to share between threads."""

    def __init__(self, url: str, token: str = "", ca: str = "", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.address = normalize_url(url)
        parts = urllib.parse.urlsplit(self.address)
        if not parts.hostname:
            raise InvalidInput(f"server URL {url!r} has no host: use http://HOST:PORT")
        self._https = parts.scheme.lower() == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self._ca = ca
        self._timeout_s = timeout_s
        self._main = _Channel()
        # A watch holds its connection for up to a minute: on a connection of its own, so the
        # heartbeats of the same lease (another thread, the main channel) are never held behind it.
        self._watching = _Channel()
        # A waiting run asks its place on a connection of its own: the main one carries its claim.
        self._asking = _Channel()
        # The attestation ticket of each lease claimed here: only a claim's answer carries one.
        self._tickets: Dict[str, AttestTicket] = {}

    # -- PoolClient -------------------------------------------------------

    def call(self, op: Operation[A], **args: Any) -> A:
        """The HTTP request of `op` (`core.operations`: its route, query and body), its answer decoded."""
        query, body = op.wire(args)
        path = op.path.format(**{name: _quote(args[name]) for name in op.path_args()})
        if query:
            path += "?" + urllib.parse.urlencode(query)
        # The server holds a waiting claim or a watch up to its seconds: the client waits longer.
        timeout_s = float(args[op.waits]) + self._timeout_s if op.waits else None
        channel = {"watch": self._watching, "ask": self._asking}.get(op.channel, self._main)
        data = self.request(op.method, path, body, timeout_s=timeout_s, retry=op.retry, channel=channel)
        answer = op.decode(data)
        if op is ops.CLAIM:  # the attestation ticket of a lease: only a claim's answer carries one
            self._tickets[data.get("id", "")] = AttestTicket.from_answer(data) or AttestTicket("", "")
        elif op is ops.RELEASE:
            self._tickets.pop(args["lease_id"], None)
        return answer

    def attest_ticket(self, lease_id: str) -> Optional[AttestTicket]:
        return self._tickets.get(lease_id, AttestTicket("", ""))

    def close(self) -> None:
        """Close the connections; a watch in flight in another thread ends at once (ServerUnreachable)."""
        self._watching.interrupt()
        for channel in (self._main, self._watching, self._asking):
            with channel.lock:
                channel.drop()

    # -- transport --------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Optional[Dict[str, Any]] = None,
        *,
        timeout_s: Optional[float] = None,
        retry: bool = True,
        channel: Optional[_Channel] = None,
    ) -> Dict[str, Any]:
        """Send one JSON request; returns the JSON answer or raises the server's error class.

        Args:
            retry: resend once on a dropped keep-alive connection; off for
                requests that must not run twice (a claim).
            channel: the connection to send it on (default: the main one).
        """
        channel = channel or self._main
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", "User-Agent": "gpupool-client"}
        if payload is not None or method != "GET":  # a loopback server without auth wants JSON on every change
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        with channel.lock:
            for attempt in (1, 2):
                try:
                    conn = self._connection(channel, timeout_s or self._timeout_s)
                    status, raw, will_close = conn.exchange(method, self._prefix + path, payload, headers)
                    if will_close:
                        channel.drop()
                    break
                except _cert_error(self._https) as err:
                    channel.drop()
                    raise ServerUnreachable(
                        f"TLS verification of {self.address} failed ({getattr(err, 'verify_message', err)}): "
                        "set 'ca' in the client config to the pool's ca.crt, or check the host name"
                    ) from None
                except _DROPPED as err:
                    channel.drop()
                    if attempt == 2 or not retry:
                        raise self._unreachable(err) from None
                    log.debug("connection to %s dropped (%s), reconnecting", self.address, err)
                except OSError as err:
                    channel.drop()
                    raise self._unreachable(err) from None
        return self._decode(method, path, status, raw)

    def _decode(self, method: str, path: str, status: int, raw: bytes) -> Dict[str, Any]:
        try:
            data = json.loads(raw.decode("utf-8")) if raw else {}
        except ValueError:
            data = None
        if 200 <= status < 300:
            if not isinstance(data, dict):
                raise GpupoolError(f"{self.address} answered {method} {path} with no JSON object (HTTP {status})")
            return data
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            err = error_from_dict(data, status)
        elif isinstance(data, dict) and "detail" in data:  # a framework error, not ours
            err = error_for_status(status, f"{self.address}: {data['detail']}")
        else:
            err = error_for_status(status, f"{self.address} answered {method} {path} with HTTP {status}")
        if isinstance(err, Unauthorized):
            err = Unauthorized(
                f"{err.message} (server {self.address}): "
                + ("the token was refused; " if self._token else "no token was sent; ")
                + "a client sends the token of its bundle's client.yaml, or of $GPUPOOL_TOKEN"
            )
        raise err

    def _connection(self, channel: _Channel, timeout_s: float) -> _Connection:
        if channel.conn is not None and _dropped(channel.conn):
            channel.drop()
        if channel.conn is None:
            context = _tls_context(self._ca) if self._https else None
            channel.conn = _Connection(self._host, self._port, timeout_s, context)
        channel.conn.sock.settimeout(timeout_s)
        return channel.conn

    def _unreachable(self, err: BaseException) -> ServerUnreachable:
        reason = str(err) or type(err).__name__
        refused = isinstance(err, (ConnectionRefusedError, socket.gaierror, socket.timeout))
        if not self._https and not refused and _speaks_tls(self._host, self._port):
            secure = "https://" + self.address.split("://", 1)[-1]
            return ServerUnreachable(
                f"{self.address} closed the connection: this server speaks TLS: use {secure} "
                "(and its CA: --ca, or the bundle's client.yaml)"
            )
        return ServerUnreachable(
            f"cannot reach the gpupool server at {self.address} ({reason}): check that "
            "`gpupool server` runs there and the URL/port is right, or pass another --server"
        )


# How long the probe of a plain-HTTP URL's server for TLS (a clearer error) may take.
TLS_PROBE_S = 3.0


def _speaks_tls(host: str, port: int) -> bool:
    """Whether the server at host:port completes a TLS handshake (certificate unchecked: only to say
    that an http:// URL should be https://; nothing is sent over it)."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=TLS_PROBE_S) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except (OSError, ValueError):
        return False


class _Channel:
    """One kept-alive connection (made at first use) and the lock that sends one request at a time on it."""

    def __init__(self) -> None:
        self.conn: Optional[_Connection] = None
        self.lock = threading.Lock()

    def interrupt(self) -> None:
        """Wake a request blocked on this channel's connection (without its lock: the request holds it)."""
        conn = self.conn
        if conn is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass

    def drop(self) -> None:
        """Close the connection (the caller holds the lock); the next request makes a new one."""
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None


class _Connection:
    """One HTTP/1.1 connection to host:port (TLS with `context`), one request at a time."""

    def __init__(self, host: str, port: int, timeout_s: float, context: Optional[ssl.SSLContext] = None) -> None:
        # An ASCII host name goes to getaddrinfo as bytes: a str one is encoded with the "idna"
        # codec, whose import (stringprep, unicodedata) costs about a millisecond of every run.
        address: Tuple[Any, int] = (host.encode("ascii") if host.isascii() else host, port)
        sock = socket.create_connection(address, timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small requests, answered at once
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock: socket.socket = sock
        self._reader = sock.makefile("rb")
        name = f"[{host}]" if ":" in host else host
        self._host_header = name if port == (443 if context is not None else 80) else f"{name}:{port}"

    def exchange(
        self, method: str, target: str, body: Optional[bytes], headers: Dict[str, str]
    ) -> Tuple[int, bytes, bool]:
        """Send one request, read its whole answer: (status, body, whether the server closes)."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        self.sock.sendall("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + (body or b""))
        status, fields, version = self._head()
        while 100 <= status < 200:  # interim answers (100 Continue) carry no body
            status, fields, version = self._head()
        connection = fields.get("connection", "").lower()
        will_close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if method == "HEAD" or status in (204, 304):
            return status, b"", will_close
        if "chunked" in fields.get("transfer-encoding", "").lower():
            return status, self._chunked(), will_close
        if "content-length" in fields:
            try:
                length = int(fields["content-length"])
            except ValueError:
                raise HttpProtocolError(f"bad Content-Length {fields['content-length']!r}") from None
            return status, self._exactly(length), will_close
        return status, self._reader.read(), True  # delimited by the end of the connection

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            self.sock.close()

    def _line(self) -> bytes:
        line = self._reader.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise HttpProtocolError("header line too long")
        return line

    def _head(self) -> Tuple[int, Dict[str, str], str]:
        first = self._line()
        if not first:
            raise Disconnected("the server closed the connection without answering")
        parts = first.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpProtocolError(f"not an HTTP answer: {first[:80]!r}")
        fields: Dict[str, str] = {}
        for _ in range(_MAX_HEADERS):
            line = self._line()
            if line in (b"\r\n", b"\n", b""):
                return int(parts[1]), fields, parts[0]
            name, _, value = line.decode("latin-1").partition(":")
            key = name.strip().lower()
            fields[key] = f"{fields[key]}, {value.strip()}" if key in fields else value.strip()
        raise HttpProtocolError(f"more than {_MAX_HEADERS} header lines")

    def _exactly(self, length: int) -> bytes:
        data = self._reader.read(length)
        if len(data) < length:
            raise Disconnected(f"the server closed the connection {len(data)} of {length} bytes into its answer")
        return data

    def _chunked(self) -> bytes:
        chunks: List[bytes] = []
        while True:
            size_line = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise HttpProtocolError(f"bad chunk size {size_line[:20]!r}") from None
            if size == 0:
                while self._line() not in (b"\r\n", b"\n", b""):  # trailer fields, ignored
                    pass
                return b"".join(chunks)
            chunks.append(self._exactly(size))
            self._exactly(2)  # the CRLF after each chunk


def _cert_error(https: bool) -> Union[Type[Exception], Tuple[()]]:
    """ssl.SSLCertVerificationError on an HTTPS connection (ssl is loaded there), else nothing:
    `except ()` catches no exception, and plain HTTP never imports ssl."""
    return sys.modules["ssl"].SSLCertVerificationError if https and "ssl" in sys.modules else ()


def _dropped(conn: _Connection) -> bool:
    """Whether the server closed an idle kept-alive connection (readable with EOF)."""
    sock = conn.sock
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _quote(text: str) -> str:
    return urllib.parse.quote(str(text), safe="")


def _tls_context(ca_file: Optional[str]) -> ssl.SSLContext:
    """A verifying TLS context trusting `ca_file` (or the system CAs); a bad file is bad input."""
    import ssl

    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except OSError as err:  # missing file, or not PEM (ssl.SSLError is an OSError)
        raise InvalidInput(
            f"CA file {ca_file!r} cannot be used ({err.strerror or err}): give the ca.crt of the server's "
            "token bundle (the 'ca' of client.yaml, or GPUPOOL_CA)"
        ) from None
