"""The HTTP key-value store Horovod's gloo workers rendezvous through.

`horovodrun --gloo` runs one (horovod.runner.http.http_server); a job run by
gpupool runs this one instead: PUT /scope/key stores the body, GET returns it
or 404 until it exists (the workers poll), DELETE /scope drops the scope.
Standard library only, one thread per request, loopback or all interfaces.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Tuple


class _Handler(BaseHTTPRequestHandler):
    server: KVStoreServer

    def _scope_key(self) -> Tuple[str, str]:
        parts = self.path.strip("/").split("/", 1)
        return parts[0], parts[1] if len(parts) > 1 else ""

    def do_GET(self) -> None:
        scope, key = self._scope_key()
        with self.server.lock:
            value = self.server.data.get(scope, {}).get(key)
        if value is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(value)))
        self.end_headers()
        self.wfile.write(value)

    def do_PUT(self) -> None:
        scope, key = self._scope_key()
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        with self.server.lock:
            self.server.data.setdefault(scope, {})[key] = body
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self) -> None:
        scope, key = self._scope_key()
        with self.server.lock:
            if key:
                self.server.data.get(scope, {}).pop(key, None)
            else:
                self.server.data.pop(scope, None)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:  # workers poll a lot: keep stderr quiet
        pass


class KVStoreServer(ThreadingHTTPServer):
    """A started-on-demand store; `start()` serves it on a daemon thread."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
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
    """`python -m gpupool.jobs.rendezvous.kvstore --port 29400`: serve until killed."""
    import argparse

    parser = argparse.ArgumentParser(description="Horovod gloo rendezvous key-value store")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=29400)
    args = parser.parse_args()
    server = KVStoreServer(args.host, args.port)
    server.serve_forever()


if __name__ == "__main__":
    main()
