"""HTTP client of a pool server (stdlib http.client): keep-alive, bearer token, TLS with a CA file."""

from __future__ import annotations

import http.client
import json
import select
import ssl
import threading
import urllib.parse
from typing import Any, Dict, Optional

from ..core.errors import (
    GpupoolError,
    InvalidInput,
    ServerUnreachable,
    Unauthorized,
    error_for_status,
    error_from_dict,
)
from ..core.model import Claim, Holder, Lease, PoolStatus
from ..logs import get_logger
from .base import PoolClient
from .config import normalize_url

log = get_logger(__name__)

DEFAULT_TIMEOUT_S = 30.0
# Failures that mean "the socket went away", where one fresh connection is worth a try.
_DROPPED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.BadStatusLine)


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
        self._conn: Optional[http.client.HTTPConnection] = None
        self._lock = threading.Lock()  # http.client connections are not thread-safe

    # -- PoolClient -------------------------------------------------------

    def claim(self, claim: Claim, holder: Holder, *, wait_s: float = 0.0, ttl_s: float = 30.0) -> Lease:
        body = {"claim": claim.to_dict(), "holder": holder.to_dict(), "wait_s": wait_s, "ttl_s": ttl_s}
        # The server holds the request while the claim waits in its queue.
        data = self.request("POST", "/v1/leases", body, timeout_s=wait_s + self._timeout_s, retry=False)
        return Lease.from_dict(data)

    def heartbeat(self, lease_id: str) -> Lease:
        return Lease.from_dict(self.request("POST", f"/v1/leases/{_quote(lease_id)}/heartbeat"))

    def release(self, lease_id: str) -> None:
        self.request("DELETE", f"/v1/leases/{_quote(lease_id)}")

    def status(self) -> PoolStatus:
        return PoolStatus.from_dict(self.request("GET", "/v1/status"))

    def get_lease(self, lease_id: str) -> Lease:
        """One lease by id (NotFound when it expired or was released)."""
        return Lease.from_dict(self.request("GET", f"/v1/leases/{_quote(lease_id)}"))

    def close(self) -> None:
        with self._lock:
            self._drop()

    # -- transport --------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Optional[Dict[str, Any]] = None,
        *,
        timeout_s: Optional[float] = None,
        retry: bool = True,
    ) -> Dict[str, Any]:
        """Send one JSON request; returns the JSON answer or raises the server's error class.

        Args:
            retry: resend once on a dropped keep-alive connection; off for
                requests that must not run twice (a claim).
        """
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", "User-Agent": "gpupool-client"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        with self._lock:
            for attempt in (1, 2):
                conn = self._connection(timeout_s or self._timeout_s)
                try:
                    conn.request(method, self._prefix + path, body=payload, headers=headers)
                    response = conn.getresponse()
                    raw = response.read()
                    status = response.status
                    if response.will_close:
                        self._drop()
                    break
                except ssl.SSLCertVerificationError as err:
                    self._drop()
                    raise ServerUnreachable(
                        f"TLS verification of {self.address} failed ({err.verify_message}): "
                        "set 'ca' in the client config to the pool's ca.crt, or check the host name"
                    ) from None
                except _DROPPED as err:
                    self._drop()
                    if attempt == 2 or not retry:
                        raise self._unreachable(err) from None
                    log.debug("connection to %s dropped (%s), reconnecting", self.address, err)
                except (OSError, http.client.HTTPException) as err:
                    self._drop()
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
                + "put a valid token in the client config (gpupool token create) or GPUPOOL_TOKEN"
            )
        raise err

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._conn is not None and _dropped(self._conn):
            self._drop()
        if self._conn is None:
            if self._https:
                context = _tls_context(self._ca)
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s, context=context)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
        self._conn.timeout = timeout_s
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout_s)
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _unreachable(self, err: BaseException) -> ServerUnreachable:
        reason = str(err) or type(err).__name__
        return ServerUnreachable(
            f"cannot reach the gpupool server at {self.address} ({reason}): check that "
            "`gpupool server` runs there and the URL/port is right, or pass another --server"
        )


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether the server closed an idle kept-alive connection (readable with EOF)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _quote(text: str) -> str:
    return urllib.parse.quote(str(text), safe="")


def _tls_context(ca_file: Optional[str]) -> ssl.SSLContext:
    """A verifying TLS context trusting `ca_file` (or the system CAs); a bad file is bad input."""
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except OSError as err:  # missing file, or not PEM (ssl.SSLError is an OSError)
        raise InvalidInput(
            f"CA file {ca_file!r} cannot be used ({err.strerror or err}): give the ca.crt of the server's "
            "token bundle (the 'ca' of client.yaml, or GPUPOOL_CA)"
        ) from None
