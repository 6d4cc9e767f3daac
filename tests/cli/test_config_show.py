"""Issue 25, item 1: `gpupool config show` says which pool the verbs use, and where the pool, its
token and its CA come from (flags, then env, then the config file); it never prints the token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from envs import clean_env


def show(tmp_path: Path, *argv: str, **env_extra: str) -> List[Dict[str, str]]:
    env = clean_env(HOME=str(tmp_path / "home"), **env_extra)
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "config", "show", "--json", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "s3cret-token" not in done.stdout + done.stderr
    return list(json.loads(done.stdout)["pools"])


def test_each_source_in_its_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (default,) = show(tmp_path)
    assert default["from"] == "default" and default["pool"] == f"embedded:{home}/.local/state/gpupool"
    (from_env,) = show(tmp_path, GPUPOOL_STATE=str(tmp_path / "st"))
    assert from_env == {**from_env, "pool": f"embedded:{tmp_path / 'st'}", "from": "$GPUPOOL_STATE"}

    (home / ".gpupool").mkdir(parents=True)
    config = home / ".gpupool" / "client.yaml"
    (home / ".gpupool" / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    config.write_text(json.dumps({"servers": [{"url": "https://gpu1:56001", "token": "s3cret-token", "ca": "ca.crt"}]}))
    (bundle,) = show(tmp_path)
    assert bundle["pool"] == "https://gpu1:56001" and bundle["from"] == str(config)
    assert bundle["token_from"] == str(config) and bundle["ca_from"] == str(config)
    (env_server,) = show(tmp_path, GPUPOOL_SERVER="http://h:2", GPUPOOL_TOKEN="s3cret-token")
    assert env_server["from"] == "$GPUPOOL_SERVER" and env_server["token_from"] == "$GPUPOOL_TOKEN"
    (flag,) = show(tmp_path, "--state", str(tmp_path / "mine"), GPUPOOL_SERVER="http://h:2")
    assert flag["pool"] == f"embedded:{tmp_path / 'mine'}" and flag["from"] == "--state"
    two = show(tmp_path, "--server", "http://a:1", "--server", "http://b:2")
    assert [p["pool"] for p in two] == ["http://a:1", "http://b:2"] and {p["from"] for p in two} == {"--server"}


def test_a_token_file_beats_the_env_and_works_against_a_server(running_server, tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text((running_server.token or "") + "\n")
    (choice,) = show(
        tmp_path, "--server", running_server.url, "--token-file", str(token_file), GPUPOOL_TOKEN="s3cret-token"
    )
    assert choice["token_from"] == "--token-file"
    env = clean_env(HOME=str(tmp_path / "home"), GPUPOOL_TOKEN="wrong-token")
    args = [sys.executable, "-m", "gpupool", "status", "--json", "--server", running_server.url]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 10  # a refused token (issue 36 item 4)
    accepted = subprocess.run(
        [*args, "--token-file", str(token_file)], capture_output=True, text=True, timeout=60, env=env
    )
    assert accepted.returncode == 0, accepted.stderr
    (tmp_path / "empty").write_text("")
    for bad, says in ((tmp_path / "missing", "No such file"), (tmp_path / "empty", "one token on one line")):
        done = subprocess.run([*args, "--token-file", str(bad)], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 2 and says in done.stderr and str(bad) in done.stderr, done.stderr
