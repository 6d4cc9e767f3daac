"""HttpPoolClient against a small stdlib HTTP server: keep-alive, token, error mapping, unreachable."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpupool.core.errors import NotFound, ServerUnreachable, Unauthorized, Unavailable
from gpupool.core.model import Claim, Holder
from gpupool.workload.client.http import HttpPoolClient

LEASE = {
    "id": "L1",
    "holder": {"name": "alice", "pid": 1, "host": "h", "label": ""},
    "devices": [{"uuid": "GPU-0", "memory_mib": 8192, "group": 0}],
    "ttl_s": 30.0,
    "created_at": 1.0,
    "expires_at": 31.0,
}


class FakeServer:
    """Answers like the pool API for a few routes and counts TCP connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                fake.connections += 1
                super().setup()

            def log_message(self, *args):
                pass

            def _answer(self, status, body, raw=None):
                data = raw if raw is not None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append((self.command, self.path, self.headers.get("Authorization"), body))
                if self.headers.get("Authorization") != "Bearer good":
                    return self._answer(401, {"error": {"code": "unauthorized", "message": "bad token"}})
                if self.path == "/v1/leases" and self.command == "POST":
                    if body["claim"]["requests"][0]["fraction"] == 1.0:
                        return self._answer(409, {"error": {"code": "unavailable", "message": "pool is full"}})
                    return self._answer(201, LEASE)
                if self.path == "/v1/leases/L1/heartbeat":
                    return self._answer(200, LEASE)
                if self.path == "/v1/leases/L1" and self.command == "DELETE":
                    return self._answer(200, {"released": "L1"})
                if self.path == "/v1/status":
                    return self._answer(200, {"devices": [], "leases": [LEASE], "queued": 2, "node": "n"})
                if self.path == "/v1/broken":
                    return self._answer(502, None, raw=b"<html>bad gateway</html>")
                return self._answer(404, {"error": {"code": "not_found", "message": f"no {self.path}"}})

            do_GET = do_POST = do_DELETE = _route

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    fake = FakeServer()
    yield fake
    fake.close()


def test_claim_heartbeat_status_release_on_one_kept_alive_connection(server):
    client = HttpPoolClient(server.url, token="good")
    lease = client.claim(Claim.single(1, fraction=0.5), Holder("x", 2, "h"), wait_s=1.5, ttl_s=10)
    assert lease.id == "L1" and lease.slices[0].memory_mib == 8192
    assert client.heartbeat("L1").expires_at == 31.0
    assert client.status().queued == 2
    client.release("L1")
    client.close()
    assert server.connections == 1
    method, path, auth, body = server.requests[0]
    assert (method, path, auth) == ("POST", "/v1/leases", "Bearer good")
    assert body["wait_s"] == 1.5 and body["ttl_s"] == 10 and body["holder"]["name"] == "x"


def test_errors_come_back_as_their_classes(server):
    client = HttpPoolClient(server.url, token="good")
    with pytest.raises(Unavailable, match="pool is full"):
        client.claim(Claim.single(1, fraction=1.0), Holder())
    with pytest.raises(NotFound):
        client.heartbeat("nope")
    with pytest.raises(Exception, match="HTTP 502"):
        client.request("GET", "/v1/broken")
    # After errors the connection is still usable.
    assert client.status().node == "n"


@pytest.mark.parametrize("token, hint", [("", "no token was sent"), ("bad", "the token was refused")])
def test_missing_or_wrong_token_says_how_to_fix_it(server, token, hint):
    with pytest.raises(Unauthorized, match=hint) as info:
        HttpPoolClient(server.url, token=token).status()
    assert info.value.exit_code == 10  # its own code, apart from a usage error (issue 36 item 4)
    assert "GPUPOOL_TOKEN" in info.value.message
    assert info.value.message.count("gpupool token create") <= 1, "one piece of advice, said once"


def test_server_closing_idle_connection_is_reconnected(server):
    client = HttpPoolClient(server.url, token="good")
    client.status()
    client._main.conn.sock.shutdown(socket.SHUT_RDWR)  # as if the server dropped it while idle
    assert client.status().queued == 2


def test_unreachable_server_names_the_url_and_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(ServerUnreachable) as info:
        HttpPoolClient(url, timeout_s=2).status()
    assert url in info.value.message and "gpupool server" in info.value.message
    assert info.value.exit_code == 5
