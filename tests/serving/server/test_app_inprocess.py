"""The app in-process, through FastAPI's routers alone and behind the fast path: same answers, no 500."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.serving.server.app import create_app
from gpupool.serving.server.auth import Authenticator
from gpupool.serving.server.fastpath import FastPath

ADMIN = "admin-token-for-tests-0123456789"
H = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(params=[False, True], ids=["routers", "fast_path"])
def client(request, tmp_path):
    pool = Pool(tmp_path / "pool", devices=emulated_devices("2x16GiB", "n"))
    app = create_app(pool, Authenticator(ADMIN, pool.store))
    with TestClient(FastPath(app, app.state.api) if request.param else app) as c:
        yield c
    pool.close()


def test_same_answers_on_both_paths(client):
    r = client.post("/v1/leases", json={"claim": {"requests": [{"count": 1, "fraction": 0.5}]}}, headers=H)
    assert r.status_code == 201
    lease_id = r.json()["id"]
    assert client.post(f"/v1/leases/{lease_id}/heartbeat", headers=H).status_code == 200
    assert client.post(f"/v1/leases/{lease_id}/heartbeat").status_code == 401
    assert client.delete(f"/v1/leases/{lease_id}", headers=H).json() == {"released": lease_id}
    assert client.delete(f"/v1/leases/{lease_id}", headers=H).status_code == 404
    r = client.post("/v1/leases", content=b"{", headers=H)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_input"
    r = client.post(
        "/v1/leases",
        json={"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "wait_s": 0.2, "ttl_s": 5},
        headers=H,
    )
    assert r.status_code == 201
    r = client.post("/v1/leases", json={"claim": {"requests": [{"count": 1, "fraction": 0.5}]}})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert 'gpupool_claims_total{result="denied"} 1.0' in client.get("/metrics").text


def test_admin_dependency_guards_tokens(client):
    r = client.post("/v1/tokens", json={"name": "alice"}, headers=H)
    assert r.status_code == 201
    alice = {"Authorization": f"Bearer {r.json()['token']}"}
    assert client.get("/v1/status", headers=alice).status_code == 200
    r = client.post("/v1/tokens", json={"name": "bob"}, headers=alice)
    assert r.status_code == 403 and "needs an admin token" in r.json()["error"]["message"]
    assert client.get("/v1/status").status_code == 401
    assert client.get("/healthz").json() == {"status": "ok"}


def test_openapi_documents_bodies_and_bearer_auth(client):
    spec = client.get("/openapi.json").json()
    assert {"ClaimRequest", "TokenRequest", "LeaseBody", "ErrorBody"} <= set(spec["components"]["schemas"])
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    claim = spec["paths"]["/v1/leases"]["post"]
    assert claim["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ClaimRequest")
    assert "401" in claim["responses"] and "/v1/leases/{lease_id}/heartbeat" in spec["paths"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
request_values = st.fixed_dictionaries(
    {"count": json_values | st.integers(0, 3), "fraction": json_values | st.floats(0, 2)},
    optional={"memory_mib": json_values, "filters": json_values},
)
bodies = st.fixed_dictionaries(
    {"claim": st.fixed_dictionaries({"requests": st.lists(request_values, max_size=2) | json_values}) | json_values},
    optional={"holder": json_values, "wait_s": json_values, "ttl_s": json_values, "extra": json_values},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies)
def test_no_input_gives_a_500_or_a_partial_allocation(client, body):
    r = client.post("/v1/leases", content=json.dumps(body).encode(), headers=H)
    assert r.status_code in (201, 400, 409, 422), r.text
    if r.status_code == 201:
        client.delete(f"/v1/leases/{r.json()['id']}", headers=H)
    else:
        assert set(r.json()["error"]) == {"code", "message"}
    status = client.get("/v1/status", headers=H).json()
    assert all(d["allocated_mib"] <= d["memory_mib"] for d in status["devices"])
    assert status["leases"] == []
