"""Issue 25, item 6: $GPUPOOL_DEVICES left exported does not silently replace the devices a state
dir serves; --devices does, on purpose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional


def gpupool(state: Path, *argv: str, devices_env: Optional[str]) -> subprocess.CompletedProcess:
    env: Dict[str, str] = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["HOME"] = str(state.parent / "home")
    if devices_env is not None:
        env["GPUPOOL_DEVICES"] = devices_env
    args = [sys.executable, "-m", "gpupool", *argv, "--state", str(state)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)


def gpus(result: subprocess.CompletedProcess) -> int:
    assert result.returncode == 0, result.stderr
    return len(json.loads(result.stdout)["devices"])


def test_the_env_may_not_replace_saved_devices_the_flag_may(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert gpus(gpupool(state, "status", "--json", devices_env="emulated:2x16GiB")) == 2
    assert gpus(gpupool(state, "status", "--json", devices_env="emulated:2x16GiB")) == 2  # the same: fine
    assert gpus(gpupool(state, "status", "--json", devices_env=None)) == 2  # none: the saved ones
    refused = gpupool(state, "status", "--json", devices_env="emulated:1x8GiB")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "$GPUPOOL_DEVICES names 1 GPU(s)" in line and "serves 2 GPU(s)" in line and "--devices" in line
    replaced = gpupool(state, "status", "--json", "--devices", "emulated:1x8GiB", devices_env="emulated:2x16GiB")
    assert gpus(replaced) == 1


def test_a_server_started_with_other_devices_in_its_env_refuses(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert gpus(gpupool(state, "status", "--json", devices_env="emulated:2x16GiB")) == 2
    server = gpupool(state, "server", "--listen", "127.0.0.1:0", devices_env="emulated:1x80GiB")
    assert server.returncode == 2 and "unset GPUPOOL_DEVICES" in server.stderr, server.stderr


def test_an_explicit_state_beats_an_installed_bundle_and_the_server_env(tmp_path: Path) -> None:
    """Issue 25, item 1: with ~/.gpupool/client.yaml (or $GPUPOOL_SERVER) naming a server, --state DIR
    still reads DIR's pool (it read the server's: `usage --state DIR` showed the server's labels)."""
    home = tmp_path / "home"
    (home / ".gpupool").mkdir(parents=True)
    (home / ".gpupool" / "client.yaml").write_text('{"servers": [{"url": "http://127.0.0.1:9", "token": "t"}]}')
    state = tmp_path / "state"
    assert gpus(gpupool(state, "status", "--json", devices_env="emulated:2x16GiB")) == 2
    env_server = dict(
        os.environ, HOME=str(home), GPUPOOL_SERVER="http://127.0.0.1:9", GPUPOOL_DEVICES="emulated:2x16GiB"
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "status", "--json", "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_server,
    )
    assert gpus(done) == 2, "the embedded pool of --state, not the (unreachable) server"
