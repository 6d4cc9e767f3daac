"""A CA file that cannot be used is bad input: exit 2 and the fix, not an OS error."""

from __future__ import annotations

import os

import pytest
from gpupool_cli import gpupool


@pytest.mark.parametrize("ca", ["missing.crt", "garbage.crt"])
def test_client_with_an_unusable_ca_file(tmp_path, ca):
    (tmp_path / "garbage.crt").write_text("not a certificate\n")
    done = gpupool("status", "--server", "https://127.0.0.1:9", env=dict(os.environ, GPUPOOL_CA=ca), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"CA file '{ca}' cannot be used" in done.stderr and "token bundle" in done.stderr
    assert "Traceback" not in done.stderr


def test_token_create_with_a_ca_that_is_not_pem(tmp_path):
    (tmp_path / "garbage.crt").write_text("not a certificate\n")
    done = gpupool(
        "token",
        "create",
        "--server",
        "https://gpu1:56001",
        "--state",
        str(tmp_path / "state"),
        "--ca",
        "garbage.crt",
        "--out",
        "bundle.tar",
        env=dict(
            os.environ,
        ),
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "--ca garbage.crt is not a PEM certificate" in done.stderr
    assert not (tmp_path / "bundle.tar").exists()
