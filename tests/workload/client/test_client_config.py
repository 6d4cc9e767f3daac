"""Client config: client.yaml (JSON), servers.conf, the bundle writer, and the server precedence."""

from __future__ import annotations

import json
import stat

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.workload.client.config import client_bundle, load_client_config, write_client_bundle
from gpupool.workload.client.resolve import server_addresses


def test_bundle_round_trips_with_ca_relative_to_the_config(tmp_path):
    paths = write_client_bundle(tmp_path / "b", ["https://pool-a:56001/", "https://pool-b:56001"], "gp_tok", "PEM")
    assert sorted(p.name for p in paths) == ["ca.crt", "client.yaml", "servers.conf"]
    for p in paths:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    config = load_client_config(tmp_path / "b" / "client.yaml")
    assert [s.url for s in config.servers] == ["https://pool-a:56001", "https://pool-b:56001"]
    assert all(s.token == "gp_tok" and s.ca == str((tmp_path / "b" / "ca.crt").resolve()) for s in config.servers)


def test_bundle_without_tls_has_no_ca():
    files = client_bundle(["http://h:1"], "t")
    assert set(files) == {"client.yaml", "servers.conf"}
    assert json.loads(files["client.yaml"]) == {"servers": [{"token": "t", "url": "http://h:1"}]}


def test_servers_conf_adds_servers_sharing_the_first_token(tmp_path):
    (tmp_path / "client.yaml").write_text(json.dumps({"servers": [{"url": "http://a:1", "token": "T"}]}))
    (tmp_path / "servers.conf").write_text("# pool\nhttp://a:1\nb:2  # bare host:port\n\n")
    config = load_client_config(tmp_path / "client.yaml")
    assert [(s.url, s.token) for s in config.servers] == [("http://a:1", "T"), ("http://b:2", "T")]


def test_env_selects_the_config_and_missing_default_is_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    assert load_client_config().servers == ()
    monkeypatch.setenv("GPUPOOL_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(InvalidInput, match="does not exist"):
        load_client_config()


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not JSON|neither JSON nor YAML"),
        ('{"servers": {"url": "x"}}', "must be a list"),
        ('{"servers": [{"url": "ftp://h"}]}', "unknown scheme"),
        ('{"servers": [{"token": "t"}]}', "needs a 'url'"),
    ],
)
def test_bad_config_says_what_is_wrong(tmp_path, text, message):
    (tmp_path / "client.yaml").write_text(text)
    with pytest.raises(InvalidInput, match=message):
        load_client_config(tmp_path / "client.yaml")


def test_precedence_flags_then_env_then_config(tmp_path, monkeypatch):
    write_client_bundle(tmp_path, ["http://from-config:1"], "t")
    monkeypatch.setenv("GPUPOOL_CONFIG", str(tmp_path / "client.yaml"))
    monkeypatch.delenv("GPUPOOL_SERVER", raising=False)
    assert server_addresses() == ["http://from-config:1"]
    monkeypatch.setenv("GPUPOOL_SERVER", "http://from-env:2,http://other:3")
    assert server_addresses() == ["http://from-env:2", "http://other:3"]
    assert server_addresses(["https://flag:4/", "embedded:/tmp/x"]) == ["https://flag:4", "embedded:/tmp/x"]
    with pytest.raises(InvalidInput, match="unknown scheme"):
        server_addresses(["grpc://flag:4"])
