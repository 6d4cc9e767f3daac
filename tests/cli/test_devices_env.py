"""Issue 25, item 6: $GPUPOOL_DEVICES left exported does not silently replace the devices a state
dir serves; --devices does, on purpose."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from envs import clean_env
from gpupool_cli import gpupool


def gpus(result: subprocess.CompletedProcess) -> int:
    assert result.returncode == 0, result.stderr
    return len(json.loads(result.stdout)["devices"])


def test_the_env_may_not_replace_saved_devices_the_flag_may(tmp_path: Path) -> None:
    state = ("--state", str(tmp_path / "state"))
    two = clean_env(tmp_path, GPUPOOL_DEVICES="emulated:2x16GiB")
    assert gpus(gpupool("status", "--json", *state, env=two)) == 2
    assert gpus(gpupool("status", "--json", *state, env=two)) == 2  # the same: fine
    assert gpus(gpupool("status", "--json", *state, env=clean_env(tmp_path))) == 2  # none: the saved ones
    refused = gpupool("status", "--json", *state, env=clean_env(tmp_path, GPUPOOL_DEVICES="emulated:1x8GiB"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "$GPUPOOL_DEVICES names 1 GPU(s)" in line and "serves 2 GPU(s)" in line and "--devices" in line
    replaced = gpupool("status", "--json", "--devices", "emulated:1x8GiB", *state, env=two)
    assert gpus(replaced) == 1


def test_a_server_started_with_other_devices_in_its_env_refuses(tmp_path: Path) -> None:
    state = ("--state", str(tmp_path / "state"))
    assert gpus(gpupool("status", "--json", *state, env=clean_env(tmp_path, GPUPOOL_DEVICES="emulated:2x16GiB"))) == 2
    server = gpupool(
        "server", "--listen", "127.0.0.1:0", *state, env=clean_env(tmp_path, GPUPOOL_DEVICES="emulated:1x80GiB")
    )
    assert server.returncode == 2 and "unset GPUPOOL_DEVICES" in server.stderr, server.stderr


def test_an_explicit_state_beats_an_installed_bundle_and_the_server_env(tmp_path: Path) -> None:
    """Issue 25, item 1: with ~/.gpupool/client.yaml (or $GPUPOOL_SERVER) naming a server, --state DIR
    still reads DIR's pool (it read the server's: `usage --state DIR` showed the server's labels)."""
    home = tmp_path / "home"
    (home / ".gpupool").mkdir(parents=True)
    (home / ".gpupool" / "client.yaml").write_text('{"servers": [{"url": "http://127.0.0.1:9", "token": "t"}]}')
    state = ("--state", str(tmp_path / "state"))
    assert gpus(gpupool("status", "--json", *state, env=clean_env(tmp_path, GPUPOOL_DEVICES="emulated:2x16GiB"))) == 2
    env_server = dict(
        os.environ, HOME=str(home), GPUPOOL_SERVER="http://127.0.0.1:9", GPUPOOL_DEVICES="emulated:2x16GiB"
    )
    done = gpupool("status", "--json", *state, env=env_server)
    assert gpus(done) == 2, "the embedded pool of --state, not the (unreachable) server"
