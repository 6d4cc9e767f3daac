"""Issue 36 item 5, through the real CLI against a TLS server (`--tls auto`): `doctor` finds its pool
as every client verb does (--token-file, $GPUPOOL_SERVER, client.yaml), every client verb takes
--ca, an http:// URL of a TLS server says to use https://, and `restore` while a server runs says
to stop the server first."""

from __future__ import annotations

import json
from pathlib import Path

from envs import clean_env
from gpupool_cli import gpupool

from gpupool.core.errors import InvalidInput, ServerUnreachable, StateLocked


def test_clients_find_a_tls_server(server_factory, tmp_path: Path) -> None:
    s = server_factory("--tls", "auto")
    assert s.url.startswith("https://")
    ca = s.state / "tls" / "ca.crt"
    admin_file = s.state.parent / f"{s.state.name}-token"
    plain = "http://" + s.url.split("://", 1)[1]

    # http:// against TLS: one line naming the https:// URL to use
    done = gpupool("status", "--server", plain, env=clean_env(tmp_path, GPUPOOL_TOKEN=s.token or ""))
    assert done.returncode == ServerUnreachable.exit_code, done.stderr
    assert f"this server speaks TLS: use {s.url}" in done.stderr and done.stderr.count("\n") == 1, done.stderr

    # --ca on client verbs: trusted with it, one line without it, a missing file named
    for argv in (["status"], ["queue", "list"], ["usage"], ["queue", "show"]):
        done = gpupool(*argv, "--server", s.url, "--ca", str(ca), env=clean_env(tmp_path, GPUPOOL_TOKEN=s.token or ""))
        assert done.returncode == 0, (argv, done.stderr)
    done = gpupool("status", "--server", s.url, env=clean_env(tmp_path, GPUPOOL_TOKEN=s.token or ""))
    assert done.returncode == ServerUnreachable.exit_code and "TLS verification" in done.stderr, done.stderr
    done = gpupool("status", "--server", s.url, "--ca", str(tmp_path / "none.crt"), env=clean_env(tmp_path))
    assert done.returncode == InvalidInput.exit_code and "none.crt" in done.stderr, done.stderr

    # doctor: --token-file, and the pool of $GPUPOOL_SERVER and of client.yaml, as other verbs
    done = gpupool(
        "doctor", "--server", s.url, "--ca", str(ca), "--token-file", str(admin_file), env=clean_env(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"pool: {s.url}", done.stdout
    env = clean_env(tmp_path, GPUPOOL_SERVER=s.url, GPUPOOL_CA=str(ca))
    done = gpupool("doctor", "--token-file", str(admin_file), "--json", env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["healthy"], done.stderr
    config = tmp_path / "client.yaml"
    config.write_text(json.dumps({"servers": [{"url": s.url, "token": s.token, "ca": str(ca)}]}))
    done = gpupool("doctor", env=clean_env(tmp_path, GPUPOOL_CONFIG=str(config)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"pool: {s.url}", done.stdout

    # restore while the server runs
    backup = tmp_path / "pool-backup.db"
    done = gpupool("backup", "--state", str(s.state), str(backup), env=clean_env(tmp_path))
    assert done.returncode == 0, done.stderr
    done = gpupool("restore", "--state", str(s.state), str(backup), env=clean_env(tmp_path))
    assert done.returncode == StateLocked.exit_code, done.stderr
    assert "stop the server first" in done.stderr and done.stderr.count("\n") == 1, done.stderr
