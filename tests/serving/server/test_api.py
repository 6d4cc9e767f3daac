"""The HTTP API against a real server subprocess on loopback."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest
from waiting import wait_until

HALF = {"requests": [{"count": 1, "fraction": 0.5}]}


def claim(server, body=None, token=None, **extra):
    payload = {"claim": body or HALF, "holder": {"name": "ignored", "pid": 7, "host": "h"}}
    payload.update(extra)
    return httpx.post(server.url + "/v1/leases", json=payload, headers=server.headers(token), timeout=30)


def test_claim_heartbeat_release(running_server):
    s = running_server
    r = claim(s)
    assert r.status_code == 201, r.text
    lease = r.json()
    assert lease["holder"]["name"] == "admin"  # from the token, not the body
    assert lease["devices"][0]["memory_mib"] == 8192
    h = s.headers()
    assert httpx.get(f"{s.url}/v1/leases/{lease['id']}", headers=h).json()["id"] == lease["id"]
    assert [x["id"] for x in httpx.get(f"{s.url}/v1/leases", headers=h).json()["leases"]] == [lease["id"]]
    renewed = httpx.post(f"{s.url}/v1/leases/{lease['id']}/heartbeat", headers=h).json()
    assert renewed["expires_at"] >= lease["expires_at"]
    status = httpx.get(f"{s.url}/v1/status", headers=h).json()
    assert sum(d["allocated_mib"] for d in status["devices"]) == 8192 and status["queued"] == 0
    devices = httpx.get(f"{s.url}/v1/devices", headers=h).json()["devices"]
    assert [d["uuid"].startswith("GPU-emu-") for d in devices] == [True, True]
    r = httpx.delete(f"{s.url}/v1/leases/{lease['id']}", headers=h)
    assert r.json() == {"released": lease["id"]}
    r = httpx.delete(f"{s.url}/v1/leases/{lease['id']}", headers=h)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_auth_and_holders(running_server):
    s = running_server
    r = httpx.post(s.url + "/v1/leases", json={"claim": HALF})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert claim(s, token="wrong-token-123456").status_code == 401
    assert httpx.get(s.url + "/v1/status", headers={"Authorization": "Basic abc"}).status_code == 401

    def new_token(name, admin=False, token=None, replace=False):
        body = {"name": name, "admin": admin, "replace": replace}
        return httpx.post(s.url + "/v1/tokens", json=body, headers=s.headers(token))

    alice = new_token("alice").json()["token"]
    bob = new_token("bob").json()["token"]
    assert new_token("carol", token=alice).status_code == 403
    lease = claim(s, token=alice).json()
    assert lease["holder"]["name"] == "alice"
    assert lease["holder"]["pid"] == 7
    for call in (httpx.post, httpx.delete):
        path = f"{s.url}/v1/leases/{lease['id']}" + ("/heartbeat" if call is httpx.post else "")
        r = call(path, headers=s.headers(bob))
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert httpx.post(f"{s.url}/v1/leases/{lease['id']}/heartbeat", headers=s.headers(alice)).status_code == 200
    assert httpx.delete(f"{s.url}/v1/leases/{lease['id']}", headers=s.headers()).status_code == 200  # admin
    # a name that exists is refused; replacing it is asked for, and the old token stops working
    assert new_token("alice").status_code == 400
    new_alice = new_token("alice", replace=True).json()["token"]
    assert new_alice != alice and claim(s, token=alice).status_code == 401
    assert claim(s, token=new_alice).status_code == 201
    # tokens are stored as hashes only
    assert alice.encode() not in (s.state / "pool.db").read_bytes()


@pytest.mark.parametrize(
    "body, status, code",
    [
        (b"{not json", 400, "invalid_input"),
        (b"[1, 2]", 400, "invalid_input"),
        (b'{"claim": {"requests": [{"count": 0, "fraction": 0.5}]}}', 422, "invalid_claim"),
        (b'{"claim": {"requests": [{"count": 1, "fraction": 1.5}]}}', 422, "invalid_claim"),
        (b'{"claim": {"requests": [{"count": "one", "fraction": 0.5}]}}', 422, "invalid_claim"),
        (b'{"claim": {"requests": [{"count": 1, "fraction": "half"}]}}', 422, "invalid_claim"),
        (b'{"claim": {"requests": [{"count": 1, "fraction": 0.5, "filters": ["gpu.kind=x"]}]}}', 422, "invalid_claim"),
        (b'{"claim": {"requests": [{"count": 3, "fraction": 0.5}]}}', 422, "unsatisfiable"),
        (b'{"claim": {"requests": []}}', 422, "invalid_claim"),
        (b'{"claim": "x"}', 422, "invalid_claim"),
        (b'{"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "holder": [1]}', 400, "invalid_input"),
        (b'{"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "holder": {"pid": 1e400}}', 422, "invalid_claim"),
        (b'{"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "wait_s": "long"}', 422, "invalid_claim"),
        (b'{"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "ttl_s": -3}', 422, "invalid_claim"),
        (b'{"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "color": 1}', 400, "invalid_input"),
        (b'{"holder": {}}', 422, "invalid_claim"),
    ],
)
def test_bad_input_is_4xx_json_and_allocates_nothing(running_server, body, status, code):
    s = running_server
    r = httpx.post(
        s.url + "/v1/leases", content=body, headers=dict(s.headers(), **{"Content-Type": "application/json"})
    )
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert r.json()["error"]["message"]
    assert httpx.get(s.url + "/v1/leases", headers=s.headers()).json()["leases"] == []


def test_other_bad_requests(running_server):
    s = running_server
    h = s.headers()
    for r, status in [
        (httpx.post(s.url + "/v1/tokens", content=b"{", headers=h), 400),
        (httpx.post(s.url + "/v1/tokens", json={"name": "x y"}, headers=h), 400),
        (httpx.post(s.url + "/v1/tokens", json={"name": "ok", "admin": "yes"}, headers=h), 400),
        (httpx.get(s.url + "/v1/leases/nope", headers=h), 404),
        (httpx.get(s.url + "/v1/nothing", headers=h), 404),
        (httpx.put(s.url + "/v1/leases", headers=h), 405),
    ]:
        assert r.status_code == status, r.text
        assert "error" in r.json()


def test_unavailable_and_waiting(running_server):
    s = running_server
    full = claim(s, {"requests": [{"count": 2, "fraction": 1.0}]}).json()
    r = claim(s)
    assert r.status_code == 409 and r.json()["error"]["code"] == "unavailable"
    assert "most free" in r.json()["error"]["message"]
    # A waiting claim is granted when the room frees, without blocking the server meanwhile.
    result = {}
    waiter = threading.Thread(target=lambda: result.update(r=claim(s, wait_s=120)))
    waiter.start()

    def queued() -> int:
        return httpx.get(s.url + "/v1/status", headers=s.headers(), timeout=30).json()["queued"]

    wait_until(lambda: queued() == 1, 60, "the waiting claim in the queue")
    assert queued() == 1
    httpx.delete(f"{s.url}/v1/leases/{full['id']}", headers=s.headers())
    waiter.join(120)
    assert result["r"].status_code == 201


def test_dead_client_lease_is_reclaimed_after_ttl(running_server):
    s = running_server
    lease = claim(s, {"requests": [{"count": 2, "fraction": 1.0}]}, ttl_s=1).json()
    # TTL 1 s + expiry interval 1 s, no heartbeat: reclaimed after about 2 s (the limit leaves room for
    # a loaded machine). The lease leaves /v1/leases at its TTL, the reclaim (counted) comes with the next sweep.
    wait_until(lambda: "gpupool_leases_expired_total 1.0" in httpx.get(s.url + "/metrics").text, 60, "the reclaim")
    assert httpx.get(s.url + "/v1/leases", headers=s.headers()).json()["leases"] == []
    r = httpx.post(f"{s.url}/v1/leases/{lease['id']}/heartbeat", headers=s.headers())
    assert r.status_code == 404
    metrics = httpx.get(s.url + "/metrics").text
    assert "gpupool_leases_expired_total 1.0" in metrics


def test_metrics_healthz_openapi(running_server):
    s = running_server
    assert httpx.get(s.url + "/healthz").json() == {"status": "ok"}
    claim(s)
    claim(s, {"requests": [{"count": 9, "fraction": 0.5}]})
    text = httpx.get(s.url + "/metrics").text
    for name in (
        "gpupool_device_memory_total_mib{",
        "gpupool_device_memory_allocated_mib{",
        "gpupool_leases 1.0",
        "gpupool_queue_length 0.0",
        'gpupool_claims_total{result="granted"} 1.0',
        'gpupool_claims_total{result="unsatisfiable"} 1.0',
        "gpupool_claim_latency_seconds_bucket",
    ):
        assert name in text, name
    spec = httpx.get(s.url + "/openapi.json").json()
    assert "/v1/leases" in spec["paths"] and "ClaimRequest" in spec["components"]["schemas"]


def _queued(s) -> int:
    return httpx.get(s.url + "/v1/status", headers=s.headers(), timeout=30).json()["queued"]


@pytest.mark.parametrize("fast_path", ["1", "0"], ids=["fast_path", "routers"])
def test_a_waiting_claim_whose_client_left_leaves_the_queue(server_factory, monkeypatch, fast_path):
    monkeypatch.setenv("GPUPOOL_FAST_PATH", fast_path)  # the server subprocess inherits it
    s = server_factory()
    full = claim(s, {"requests": [{"count": 2, "fraction": 1.0}]}).json()
    body = json.dumps({"claim": HALF, "wait_s": 600}).encode()
    host, port = s.url.split("//")[1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {s.token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    assert wait_until(lambda: _queued(s) == 1, 60)
    sock.close()
    # Long before its own wait (600 s) runs out: the server saw the client go.
    assert wait_until(lambda: _queued(s) == 0, 60)
    httpx.delete(f"{s.url}/v1/leases/{full['id']}", headers=s.headers())
    assert httpx.get(s.url + "/v1/leases", headers=s.headers()).json()["leases"] == []
    assert 'gpupool_claims_total{result="unavailable"} 1.0' in httpx.get(s.url + "/metrics").text
