"""Issue 25, item 3: tokens as an admin expects: list (with last use), revoke, rotate, and a name
that exists is refused without --replace; through a real server and directly in a state dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import httpx
from envs import clean_env
from gpupool_cli import gpupool


def token_of(tar: Path) -> str:
    import tarfile

    with tarfile.open(tar) as bundle:
        member = bundle.extractfile("client.yaml")
        assert member is not None
        return str(json.loads(member.read())["servers"][0]["token"])  # JSON is YAML


def status_code(url: str, token: str) -> int:
    return httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"}).status_code


def names(tmp_path: Path, *where: str) -> List[Dict[str, object]]:
    listed = gpupool("token", "list", "--json", *where, env=clean_env(tmp_path))
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout)["tokens"])


def test_list_revoke_rotate_and_replace_through_the_server(server_factory, tmp_path: Path) -> None:
    server = server_factory()
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(server.token or "")
    remote = ("--server", server.url, "--admin-token-file", str(admin_file))
    env = clean_env(tmp_path)
    made = gpupool("token", "create", "--name", "alice", "--out", str(tmp_path / "a.tar"), *remote, env=env)
    assert made.returncode == 0, made.stderr
    alice = token_of(tmp_path / "a.tar")
    again = gpupool("token", "create", "--name", "alice", "--out", str(tmp_path / "b.tar"), *remote, env=env)
    assert again.returncode == 2 and "exists already" in again.stderr and "--replace" in again.stderr
    assert status_code(server.url, alice) == 200, "a refused create leaves the token as it was"
    (row,) = names(tmp_path, *remote)
    assert row["name"] == "alice" and row["last_used"] is not None and row["origin"] == "api"
    table = gpupool("token", "list", *remote, env=env)
    assert table.stdout.splitlines()[0] == f"pool: {server.url}"
    assert table.stdout.splitlines()[1].split()[:3] == ["NAME", "ADMIN", "QUEUE"] and "alice" in table.stdout

    rotated = gpupool("token", "rotate", "alice", "--out", str(tmp_path / "r.tar"), *remote, env=env)
    assert rotated.returncode == 0, rotated.stderr
    new = token_of(tmp_path / "r.tar")
    assert new != alice and status_code(server.url, alice) == 401 and status_code(server.url, new) == 200

    replaced = gpupool(
        "token", "create", "--name", "alice", "--replace", "--out", str(tmp_path / "c.tar"), *remote, env=env
    )
    assert replaced.returncode == 0, replaced.stderr
    assert status_code(server.url, new) == 401 and status_code(server.url, token_of(tmp_path / "c.tar")) == 200

    revoked = gpupool("token", "revoke", "alice", *remote, env=env)
    assert revoked.returncode == 0 and status_code(server.url, token_of(tmp_path / "c.tar")) == 401
    assert names(tmp_path, *remote) == []
    gone = gpupool("token", "revoke", "alice", *remote, env=env)
    assert gone.returncode == 4 and "no token 'alice'" in gone.stderr


def test_list_and_revoke_in_a_state_dir_and_refusals_without_auth(server_factory, tmp_path: Path) -> None:
    state = tmp_path / "s"
    out = str(tmp_path / "x.tar")
    env = clean_env(tmp_path)
    made = gpupool(
        "token", "create", "--name", "bob", "--state", str(state), "--server", "http://h:1", "--out", out, env=env
    )
    assert made.returncode == 0, made.stderr
    assert [t["name"] for t in names(tmp_path, "--state", str(state))] == ["bob"]
    assert gpupool("token", "revoke", "bob", "--state", str(state), env=env).returncode == 0
    assert names(tmp_path, "--state", str(state)) == []
    open_server = server_factory(token=False)
    answer = httpx.post(f"{open_server.url}/v1/tokens/bob/rotate", json={})
    assert answer.status_code == 403 and "without auth" in answer.json()["error"]["message"]


def test_list_and_revoke_over_tls_verify_the_server_with_ca(server_factory, tmp_path: Path) -> None:
    server = server_factory("--tls", "auto")
    assert server.url.startswith("https://")
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(server.token or "")
    remote = ("--server", server.url, "--admin-token-file", str(admin_file))
    ca = ("--ca", str(server.state / "tls" / "ca.crt"))
    env = clean_env(tmp_path)
    made = gpupool("token", "create", "--name", "carol", "--out", str(tmp_path / "c.tar"), *remote, *ca, env=env)
    assert made.returncode == 0, made.stderr
    unverified = gpupool("token", "list", *remote, env=env)
    assert unverified.returncode != 0 and len(unverified.stderr.strip().splitlines()) == 1
    assert [row["name"] for row in names(tmp_path, *remote, *ca)] == ["carol"]
    revoked = gpupool("token", "revoke", "carol", *remote, *ca, env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert names(tmp_path, *remote, *ca) == []
