"""Issue 9: no admin by accident, no 500 and no traceback for bad input, on both paths of the app."""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest
from fastapi.testclient import TestClient

from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.pool import Pool
from gpupool.pooling.store import Store
from gpupool.pooling.store.schema import SCHEMA_VERSION
from gpupool.serving.server.app import create_app
from gpupool.serving.server.auth import Authenticator, create_token, install_token, token_hash
from gpupool.serving.server.fastpath import FastPath

ADMIN = "admin-token-for-tests-0123456789"
H = {"Authorization": f"Bearer {ADMIN}"}
HALF = {"claim": {"requests": [{"count": 1, "fraction": 0.5}]}}


def _client(tmp_path, fast_path: bool, auth: bool = True) -> TestClient:
    pool = Pool(tmp_path / "pool", devices=emulated_devices("2x16GiB", "n"))
    app = create_app(pool, Authenticator(ADMIN, pool.store) if auth else None)
    client = TestClient(FastPath(app, app.state.api) if fast_path else app, raise_server_exceptions=False)
    client.pool = pool  # type: ignore[attr-defined]
    return client


@pytest.fixture(params=[False, True], ids=["routers", "fast_path"])
def client(request, tmp_path):
    with _client(tmp_path, request.param) as c:
        yield c
    c.pool.close()


# --- 1. tokens ------------------------------------------------------------------------
def test_a_server_without_auth_mints_no_tokens(tmp_path):
    with _client(tmp_path, fast_path=True, auth=False) as c:
        r = c.post("/v1/tokens", json={"name": "mallory", "admin": True})
        assert r.status_code == 403
        assert "--token-file" in r.json()["error"]["message"]
        assert c.post("/v1/leases", json=HALF).status_code == 201  # the rest still serves anonymously
    with c.pool.store.read() as tx:
        assert tx.token_by_hash(token_hash("x")) is None
        assert tx.conn.execute("SELECT COUNT(*) FROM tokens").fetchone()[0] == 0
    c.pool.close()


def _schema_1_state(state) -> None:
    """A state dir as gpupool wrote it before token origins: one token minted without auth."""
    state.mkdir()
    conn = sqlite3.connect(state / "pool.db")
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '1');"
        "CREATE TABLE tokens (name TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, admin INTEGER NOT NULL,"
        " created_at REAL NOT NULL);"
    )
    conn.execute("INSERT INTO tokens VALUES ('m', ?, 1, 1.0)", (token_hash("gp_minted-without-auth"),))
    conn.commit()
    conn.close()


def test_tokens_of_unknown_origin_are_not_honoured_with_auth_on(tmp_path, caplog):
    state = tmp_path / "state"
    _schema_1_state(state)
    store = Store(state)
    try:
        with store.read() as tx:
            assert tx.meta("schema_version") == str(SCHEMA_VERSION)  # migrated to the current schema
            assert tx.legacy_tokens() == ["m"]
        auth = Authenticator(ADMIN, store)
        with pytest.raises(Exception, match="not valid for this pool"):
            auth.identify("Bearer gp_minted-without-auth")
        # Tokens made now are honoured: by the admin over HTTP, in the state dir, by the node agent.
        local = create_token(store, "alice")
        assert auth.identify(f"Bearer {local}").name == "alice"
        assert install_token(store, "m", "gp_minted-without-auth")  # a Secret re-installed: origin known now
        auth.forget()
        assert auth.identify("Bearer gp_minted-without-auth") == auth.identify("Bearer gp_minted-without-auth")
        assert not auth.identify("Bearer gp_minted-without-auth").admin
    finally:
        store.close()


def test_the_server_names_tokens_it_does_not_honour_at_start(tmp_path, caplog):
    from gpupool.serving.server.serve import ServerConfig, prepare

    state = tmp_path / "state"
    _schema_1_state(state)
    with caplog.at_level(logging.WARNING):
        prepared = prepare(
            ServerConfig(
                listen="127.0.0.1:0",
                state_dir=str(state),
                devices="emulated:1x8GiB",
                token_file=str(tmp_path / "token"),
            )
        )
        prepared.close()
    assert "1 token(s) without a recorded origin are not honoured" in caplog.text and ": m;" in caplog.text


# --- 2. no 500 for bad input ---------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/leases", "/v1/tokens"])
def test_deeply_nested_json_is_a_400(client, path):
    for body in (b"[" * 100_000, b'{"a":' * 50_000, b"[" * 100_000 + b"]" * 100_000):
        r = client.post(path, content=body, headers=H)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_input"
        assert "nested" in r.json()["error"]["message"]


def test_a_body_over_the_size_limit_is_a_413(client):
    r = client.post("/v1/leases", content=b" " * (2 << 20), headers=H)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    r = client.post("/v1/tokens", content=b" " * (2 << 20), headers=H)
    assert r.status_code == 413


@pytest.mark.parametrize(
    "body",
    [
        b'{"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "holder": {"name": "\\ud800"}}',
        b'{"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "holder": {"host": "a\\udfffb", "label": "x"}}',
        b'{"claim": {"requests": [{"count": 1, "fraction": 0.5, "filters": ["device.name=\\ud800"]}]}}',
        b"\xff\xfe{}",
    ],
)
def test_lone_surrogates_and_bad_utf8_are_a_400(tmp_path, body):
    for fast in (False, True):
        with _client(tmp_path / str(fast), fast_path=fast, auth=False) as c:
            r = c.post("/v1/leases", content=body)
            assert r.status_code == 400, r.text
            assert c.get("/v1/status").json()["leases"] == []
        c.pool.close()
    with _client(tmp_path / "t", fast_path=False) as c:
        r = c.post("/v1/tokens", content=b'{"name": "\\ud800"}', headers=H)
        assert r.status_code == 400
    c.pool.close()


def test_a_bug_is_a_logged_500_with_a_request_id_and_no_traceback(client, monkeypatch, caplog):
    api = client.app.app.state.api if isinstance(client.app, FastPath) else client.app.state.api

    def broken(*_args, **_kwargs):
        raise ZeroDivisionError("secret internals /etc/passwd")

    monkeypatch.setattr(api.pool, "heartbeat", broken)
    monkeypatch.setattr(api.pool, "status", broken)
    for method, path in (("POST", "/v1/leases/abc/heartbeat"), ("GET", "/v1/status")):
        with caplog.at_level(logging.ERROR):
            r = client.request(method, path, headers=H)
        assert r.status_code == 500
        error = r.json()["error"]
        assert error["code"] == "internal"
        assert "secret" not in r.text and "Traceback" not in r.text
        request_id = error["request_id"]
        assert request_id in error["message"] and r.headers["x-request-id"] == request_id
        assert request_id in caplog.text and "ZeroDivisionError" in caplog.text


def test_no_500_for_any_of_the_reported_inputs(client):
    bodies = [b"", b"null", b"[]", b'"x"', b"1e999", b'{"claim": null}', b'{"claim": {"requests": "x"}}']
    for body in bodies:
        r = client.post("/v1/leases", content=body, headers=H)
        assert 400 <= r.status_code < 500, (body, r.text)
        assert set(r.json()["error"]) >= {"code", "message"}
    assert json.loads(client.get("/v1/status", headers=H).text)["leases"] == []


# --- 5. devices reconciled at start ------------------------------------------------------
def test_status_and_metrics_report_leases_on_gpus_that_shrank(tmp_path):
    from gpupool.core.model import Claim, Holder

    pool = Pool(tmp_path, devices=emulated_devices("2x16GiB", "n"))
    pool.claim(Claim.single(2, fraction=1.0), Holder("alice"), ttl_s=600)
    pool.close()
    pool = Pool(tmp_path, devices=emulated_devices("2x8GiB", "n"))
    with TestClient(create_app(pool, None)) as c:
        assert len(c.get("/v1/status").json()["problems"]) == 2
        assert "gpupool_lease_problems 2.0" in c.get("/metrics").text
    pool.close()


# --- 6. doctor over HTTP, and no admin tokens from a server without auth (real process) ----
def test_doctor_server_and_a_real_no_auth_server(server_factory, monkeypatch, capsys, tmp_path):
    import httpx

    from gpupool.cli.main import main

    s = server_factory()
    monkeypatch.setenv("GPUPOOL_CONFIG", str(tmp_path / "none.yaml"))
    monkeypatch.delenv("GPUPOOL_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPUPOOL_TOKEN", s.token)
    assert main(["doctor", "--server", s.url]) == 0
    assert "healthy" in capsys.readouterr().out
    s.stop()
    open_server = server_factory(token=False, state=tmp_path / "open")
    r = httpx.post(open_server.url + "/v1/tokens", json={"name": "m", "admin": True})
    assert r.status_code == 403 and "--token-file" in r.json()["error"]["message"]
    # A loopback server without auth takes JSON bodies only (issue 23 item 6): the body says it is JSON.
    r = httpx.post(open_server.url + "/v1/leases", content=b"[" * 100_000, headers={"Content-Type": "application/json"})
    assert r.status_code == 400


# --- 7. an exact OpenAPI document ---------------------------------------------------------
def test_the_openapi_document_is_exact(tmp_path):
    with _client(tmp_path / "a", fast_path=False) as on, _client(tmp_path / "b", fast_path=False, auth=False) as off:
        with_auth, without = on.get("/openapi.json").json(), off.get("/openapi.json").json()
    on.pool.close()
    off.pool.close()
    assert with_auth["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "securitySchemes" not in without["components"] and "security" not in without
    assert with_auth["paths"]["/v1/status"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in with_auth["paths"]["/healthz"]["get"]
    assert "401" in with_auth["paths"]["/v1/status"]["get"]["responses"]
    assert "401" not in without["paths"]["/v1/status"]["get"]["responses"]
    schemas = with_auth["components"]["schemas"]
    assert len(schemas["GpuRequestBody"]["oneOf"]) == 2
    assert schemas["TokenRequest"]["properties"]["name"]["pattern"].startswith("^[A-Za-z0-9]")
    assert schemas["ClaimRequest"]["additionalProperties"] is False
    for path, operations in with_auth["paths"].items():
        if not path.startswith(("/v1/", "/healthz")):
            continue
        for method, operation in operations.items():
            success = [v for k, v in operation["responses"].items() if k.startswith("2")]
            assert success and success[0]["content"]["application/json"]["schema"], (method, path)


def test_405_names_every_method_of_the_path(client):
    r = client.put("/v1/leases/abc", headers=H)
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "DELETE"}
    assert client.put("/v1/leases", headers=H).headers["allow"] == "GET, POST"


@pytest.mark.parametrize(
    "extra",
    [
        {"holder": {"pid": "12"}},
        {"holder": {"name": 5}},
        {"holder": False},
        {"claim": {"requests": [{"count": 1, "fraction": 0.5}], "policy": "BINPACK"}},
    ],
)
def test_fields_of_the_wrong_kind_are_refused_not_coerced(client, extra):
    body = dict(HALF, **extra)
    r = client.post("/v1/leases", json=body, headers=H)
    assert r.status_code in (400, 422), r.text
