"""`gpupool kube agent --dra` with flags or surroundings that cannot work: one line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

AGENT = ["-m", "gpupool", "kube", "agent", "--listen", "127.0.0.1:0", "--devices", "emulated:1x16GiB", "--no-reap"]


@pytest.mark.parametrize(
    "flags, env, says",
    [
        (["--dra", "--driver", "Bad_Driver"], {}, "--driver 'Bad_Driver' is not a DNS subdomain"),
        (["--no-device-plugin"], {}, "--no-device-plugin needs --dra"),
        (["--dra"], {"KUBECONFIG": "/nonexistent/kubeconfig"}, "set KUBECONFIG"),
    ],
)
def test_bad_dra_setups_get_one_line(tmp_path, flags, env, says):
    environ = dict(os.environ, HOME=str(tmp_path), **env)
    environ.pop("KUBERNETES_SERVICE_HOST", None)
    run = subprocess.run(
        [sys.executable, *AGENT, "--state", str(tmp_path / "state"), *flags],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert says in run.stderr
