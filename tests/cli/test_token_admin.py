"""Issue 25, item 3: tokens as an admin expects: list (with last use), revoke, rotate, and a name
that exists is refused without --replace; through a real server and directly in a state dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import httpx


def gpupool(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env: Dict[str, str] = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["HOME"] = str(tmp_path / "home")
    return subprocess.run([sys.executable, "-m", "gpupool", *argv], capture_output=True, text=True, timeout=60, env=env)


def token_of(tar: Path) -> str:
    import tarfile

    with tarfile.open(tar) as bundle:
        member = bundle.extractfile("client.yaml")
        assert member is not None
        return str(json.loads(member.read())["servers"][0]["token"])  # JSON is YAML


def status_code(url: str, token: str) -> int:
    return httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"}).status_code


def names(tmp_path: Path, *where: str) -> List[Dict[str, object]]:
    listed = gpupool(tmp_path, "token", "list", "--json", *where)
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout)["tokens"])


def test_list_revoke_rotate_and_replace_through_the_server(server_factory, tmp_path: Path) -> None:
    server = server_factory()
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(server.token or "")
    remote = ("--server", server.url, "--admin-token-file", str(admin_file))
    made = gpupool(tmp_path, "token", "create", "--name", "alice", "--out", str(tmp_path / "a.tar"), *remote)
    assert made.returncode == 0, made.stderr
    alice = token_of(tmp_path / "a.tar")
    again = gpupool(tmp_path, "token", "create", "--name", "alice", "--out", str(tmp_path / "b.tar"), *remote)
    assert again.returncode == 2 and "exists already" in again.stderr and "--replace" in again.stderr
    assert status_code(server.url, alice) == 200, "a refused create leaves the token as it was"
    (row,) = names(tmp_path, *remote)
    assert row["name"] == "alice" and row["last_used"] is not None and row["origin"] == "api"
    table = gpupool(tmp_path, "token", "list", *remote)
    assert table.stdout.splitlines()[0] == f"pool: {server.url}"
    assert table.stdout.splitlines()[1].split()[:3] == ["NAME", "ADMIN", "QUEUE"] and "alice" in table.stdout

    rotated = gpupool(tmp_path, "token", "rotate", "alice", "--out", str(tmp_path / "r.tar"), *remote)
    assert rotated.returncode == 0, rotated.stderr
    new = token_of(tmp_path / "r.tar")
    assert new != alice and status_code(server.url, alice) == 401 and status_code(server.url, new) == 200

    replaced = gpupool(
        tmp_path, "token", "create", "--name", "alice", "--replace", "--out", str(tmp_path / "c.tar"), *remote
    )
    assert replaced.returncode == 0, replaced.stderr
    assert status_code(server.url, new) == 401 and status_code(server.url, token_of(tmp_path / "c.tar")) == 200

    revoked = gpupool(tmp_path, "token", "revoke", "alice", *remote)
    assert revoked.returncode == 0 and status_code(server.url, token_of(tmp_path / "c.tar")) == 401
    assert names(tmp_path, *remote) == []
    gone = gpupool(tmp_path, "token", "revoke", "alice", *remote)
    assert gone.returncode == 4 and "no token 'alice'" in gone.stderr


def test_list_and_revoke_in_a_state_dir_and_refusals_without_auth(server_factory, tmp_path: Path) -> None:
    state = tmp_path / "s"
    out = str(tmp_path / "x.tar")
    made = gpupool(
        tmp_path, "token", "create", "--name", "bob", "--state", str(state), "--server", "http://h:1", "--out", out
    )
    assert made.returncode == 0, made.stderr
    assert [t["name"] for t in names(tmp_path, "--state", str(state))] == ["bob"]
    assert gpupool(tmp_path, "token", "revoke", "bob", "--state", str(state)).returncode == 0
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
    made = gpupool(tmp_path, "token", "create", "--name", "carol", "--out", str(tmp_path / "c.tar"), *remote, *ca)
    assert made.returncode == 0, made.stderr
    unverified = gpupool(tmp_path, "token", "list", *remote)
    assert unverified.returncode != 0 and len(unverified.stderr.strip().splitlines()) == 1
    assert [row["name"] for row in names(tmp_path, *remote, *ca)] == ["carol"]
    revoked = gpupool(tmp_path, "token", "revoke", "carol", *remote, *ca)
    assert revoked.returncode == 0, revoked.stderr
    assert names(tmp_path, *remote, *ca) == []
