"""The HTTP key-value store Horovod's gloo workers rendezvous through.

`horovodrun --gloo` runs one (horovod.runner.http.http_server); a job run by
gpupool runs this one instead: PUT /scope/key stores the body, GET returns it
or 404 until it exists (the workers poll), DELETE /scope drops the scope.
Standard library only, one thread per request.

Every request carries the job's token, or is answered 401: Horovod's C++
store builds its URLs as ``http://{ADDR}:{PORT}/{scope}/{key}`` and can send
no header, so the token travels as the first path segment. `horovod_env`
sets ``ADDR`` to ``host:port/token``, which makes that segment ``token:port``;
both forms are accepted. A body over `MAX_BODY_BYTES` is answered 413.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional, Tuple

# gloo stores rank addresses and small handshakes (bytes to a few KiB): 1 MiB is ample.
MAX_BODY_BYTES = 1 << 20
# Where the store's token is handed to a store started on its own (`python -m ...kvstore`).
TOKEN_ENV = "GPUPOOL_RENDEZVOUS_TOKEN"
# A caller silent this long mid-request is cut: a stalled connection holds a thread, not the store.
IDLE_TIMEOUT_S = 30.0
_PORT_SUFFIX = re.compile(r":\d+$")


def new_token() -> str:
    """A fresh random token for one job's store (URL-safe: it is a path segment)."""
    return secrets.token_urlsafe(24)


class _Handler(BaseHTTPRequestHandler):
    server: KVStoreServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_timeout_s)

    def _scope_key(self) -> Optional[Tuple[str, str]]:
        """(scope, key) of an authorised request; None once 401 has been sent."""
        parts = self.path.strip("/").split("/", 2)
        given = _PORT_SUFFIX.sub("", parts[0])
        if not hmac.compare_digest(given.encode(), self.server.token.encode()):
            self._reply(401, b"missing or wrong rendezvous token: use the job's HOROVOD_GLOO_RENDEZVOUS_ADDR\n")
            return None
        return (parts[1] if len(parts) > 1 else ""), (parts[2] if len(parts) > 2 else "")

    def _reply(self, status: int, body: bytes = b"") -> None:
        if status in (401, 413):  # a refused PUT's body is left unread: close rather than parse it as a request
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        where = self._scope_key()
        if where is None:
            return
        scope, key = where
        with self.server.lock:
            value = self.server.data.get(scope, {}).get(key)
        self._reply(404) if value is None else self._reply(200, value)

    def do_PUT(self) -> None:
        where = self._scope_key()
        if where is None:
            return
        try:
            length = int(self.headers.get("Content-Length", "0") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self._reply(413, f"body of {length} bytes: send at most {MAX_BODY_BYTES} bytes\n".encode())
            return
        try:
            body = self.rfile.read(length)
        except TimeoutError:  # stalled mid-body: nothing stored, the connection cut
            self.close_connection = True
            return
        if len(body) < length:  # the caller hung up mid-body
            return
        scope, key = where
        with self.server.lock:
            self.server.data.setdefault(scope, {})[key] = body
        self._reply(200)

    def do_DELETE(self) -> None:
        where = self._scope_key()
        if where is None:
            return
        scope, key = where
        with self.server.lock:
            if key:
                self.server.data.get(scope, {}).pop(key, None)
            else:
                self.server.data.pop(scope, None)
        self._reply(200)

    def log_message(self, *args: object) -> None:  # workers poll a lot: keep stderr quiet
        pass


class KVStoreServer(ThreadingHTTPServer):
    """A started-on-demand store; `start()` serves it on a daemon thread.

    Binds loopback unless told otherwise (a local job's replicas are all on
    this host); `token` defaults to a fresh random one.
    """

    daemon_threads = True

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, token: str = "", idle_timeout_s: float = IDLE_TIMEOUT_S
    ) -> None:
        super().__init__((host, port), _Handler)
        self.token = token or new_token()
        self.idle_timeout_s = idle_timeout_s
        self.data: Dict[str, Dict[str, bytes]] = {}
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> KVStoreServer:
        threading.Thread(target=self.serve_forever, name="horovod-kvstore", daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def main() -> None:
    """`python -m gpupool.jobs.rendezvous.kvstore --host POD_IP --port 29400`: serve until killed."""
    import argparse

    parser = argparse.ArgumentParser(description="Horovod gloo rendezvous key-value store")
    parser.add_argument("--host", default="127.0.0.1", help="the job's network address (default: loopback)")
    parser.add_argument("--port", type=int, default=29400)
    args = parser.parse_args()
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"error: {TOKEN_ENV} is not set: give the store the job's rendezvous token", file=sys.stderr)
        sys.exit(2)
    KVStoreServer(args.host, args.port, token).serve_forever()


if __name__ == "__main__":
    main()
