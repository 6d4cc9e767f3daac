"""Issue 23 item 6 on a real `gpupool server` without auth: local callers only, JSON bodies only, no CORS."""

from __future__ import annotations

import json
import socket
from typing import Any, Dict, Tuple

import pytest

from gpupool.serving.server.localonly import host_name

CLAIM = json.dumps({"claim": {"requests": [{"count": 1, "fraction": 0.1}]}}).encode()


def _request(port: int, method: str, path: str, headers: Dict[str, str], body: bytes = b"") -> Tuple[int, Any, str]:
    """One HTTP/1.1 request with exactly `headers` (Host included): (status, JSON body or None, head)."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
        answer = b""
        while True:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    head, _, rest = answer.partition(b"\r\n\r\n")
    text = head.decode("latin-1").lower()
    body = json.loads(rest) if "application/json" in text else None
    return int(head.split(b" ")[1]), body, text


@pytest.fixture
def open_server(server_factory, tmp_path):
    server = server_factory("--allow-host", "proxy.internal", token=False, state=tmp_path / "open")
    return int(server.url.rsplit(":", 1)[1])


def test_a_foreign_host_is_refused_with_the_fix(open_server):
    """DNS rebinding: a page's own name, resolved to 127.0.0.1, reaches no route."""
    for host in ("evil.example", "evil.example:80", f"attacker.test:{open_server}", "127.0.0.2"):
        status, body, _ = _request(open_server, "GET", "/v1/status", {"Host": host})
        assert status == 421, host
        assert repr(host_name(host)) in body["error"]["message"]
        assert f"--allow-host {host_name(host)}" in body["error"]["message"]
    status, body, _ = _request(
        open_server, "POST", "/v1/leases", {"Host": "evil.example", "Content-Type": "application/json"}, CLAIM
    )
    assert status == 421  # and no lease was made
    status, body, _ = _request(open_server, "GET", "/v1/status", {"Host": "localhost"})
    assert not body["leases"]


def test_local_names_and_allowed_hosts_are_answered(open_server):
    for host in ("localhost", f"localhost:{open_server}", "127.0.0.1", f"127.0.0.1:{open_server}", "[::1]"):
        assert _request(open_server, "GET", "/healthz", {"Host": host})[0] == 200, host
    assert _request(open_server, "GET", "/healthz", {"Host": "LOCALHOST"})[0] == 200
    assert _request(open_server, "GET", "/healthz", {"Host": f"proxy.internal:{open_server}"})[0] == 200


def test_state_changes_need_a_json_content_type(open_server):
    """A cross-origin page may POST text/plain, forms or multipart without asking: all refused."""
    local = {"Host": f"127.0.0.1:{open_server}"}
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = dict(local, **({"Content-Type": content_type} if content_type else {}))
        status, body, _ = _request(open_server, "POST", "/v1/leases", headers, CLAIM)
        assert status == 415, content_type
        assert "application/json" in body["error"]["message"]
    status, _, _ = _request(open_server, "DELETE", "/v1/leases/abc", local)
    assert status == 415
    assert _request(open_server, "GET", "/v1/status", local)[1]["leases"] == []  # nothing was claimed
    status, lease, _ = _request(
        open_server, "POST", "/v1/leases", dict(local, **{"Content-Type": "application/json; charset=utf-8"}), CLAIM
    )
    assert status == 201
    json_type = dict(local, **{"Content-Type": "application/json"})
    assert _request(open_server, "DELETE", f"/v1/leases/{lease['id']}", json_type)[0] == 200


def test_no_cors_headers_ever(open_server):
    origin = {"Host": "localhost", "Origin": "http://evil.example"}
    preflight = dict(
        origin, **{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    )
    for method, path, headers in (
        ("OPTIONS", "/v1/leases", preflight),
        ("GET", "/v1/status", origin),
        ("GET", "/", origin),
    ):
        _, _, head = _request(open_server, method, path, headers)
        assert "access-control-" not in head, (method, path, head)


def test_the_client_works_against_it(open_server):
    """gpupool's own client says JSON on every change (release included)."""
    from gpupool.core.model import Claim, Holder
    from gpupool.workload.client.http import HttpPoolClient

    pool = HttpPoolClient(f"http://127.0.0.1:{open_server}")
    lease = pool.claim(Claim.single(1, fraction=0.25), Holder("me"), ttl_s=30)
    pool.heartbeat(lease.id)
    pool.release(lease.id)


def test_an_operation_the_server_lacks_is_still_405(open_server):
    """The Content-Type rule guards the server's operations; others keep the app's 405 naming what there is."""
    status, _, head = _request(open_server, "PUT", "/v1/leases", {"Host": "localhost"})
    assert status == 405 and "allow: get, post" in head
