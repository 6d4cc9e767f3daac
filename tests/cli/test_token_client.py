"""`gpupool token create` against a server goes through the pool's own client (client.http):
over verified HTTPS with --ca, a refused admin token and a server that is not there are one line
each, and the bundle's token works against that server."""

from __future__ import annotations

import json
import subprocess
import tarfile

from envs import clean_env
from gpupool_cli import gpupool

from gpupool.workload.client.http import HttpPoolClient


def one_line(done: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupool: error:"), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_token_create_over_verified_https(server_factory, tmp_path):
    s = server_factory("--tls", "auto")
    assert s.url.startswith("https://")
    ca = s.state / "tls" / "ca.crt"
    admin_file = s.state.parent / f"{s.state.name}-token"
    out = tmp_path / "alice.tar"
    args = ["token", "create", "--server", s.url, "--name", "alice", "--admin-token-file", str(admin_file)]
    done = gpupool(
        *args, "--ca", str(ca), "--out", str(out), env=clean_env(tmp_path, GPUPOOL_STATE=str(tmp_path / "no-embedded"))
    )
    assert done.returncode == 0, done.stderr
    with tarfile.open(out) as tar:
        bundle = json.loads(tar.extractfile("client.yaml").read())  # type: ignore[union-attr]
        assert tar.extractfile("ca.crt").read().decode() == ca.read_text()  # type: ignore[union-attr]
    token = bundle["servers"][0]["token"]
    client = HttpPoolClient(s.url, token, str(ca))
    try:
        assert len(client.status().devices) == 2
    finally:
        client.close()

    # Without the pool's CA the system CAs do not vouch for it: one line naming the fix.
    done = gpupool(
        *args, "--out", str(tmp_path / "b.tar"), env=clean_env(tmp_path, GPUPOOL_STATE=str(tmp_path / "no-embedded"))
    )
    one_line(done, 5, "TLS verification", "ca.crt")


def test_a_refused_admin_token_and_a_missing_server_are_one_line(server_factory, tmp_path):
    s = server_factory()
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-admin-token\n")
    base = ["token", "create", "--name", "bob", "--admin-token-file", str(wrong), "--out", str(tmp_path / "b.tar")]
    one_line(
        gpupool(*base, "--server", s.url, env=clean_env(tmp_path, GPUPOOL_STATE=str(tmp_path / "no-embedded"))),
        10,
        s.url,
        "--admin-token-file",
    )  # a refused token
    one_line(
        gpupool(
            *base,
            "--server",
            "http://127.0.0.1:9",
            env=clean_env(tmp_path, GPUPOOL_STATE=str(tmp_path / "no-embedded")),
        ),
        5,
        "127.0.0.1:9",
    )
    assert not (tmp_path / "b.tar").exists()
