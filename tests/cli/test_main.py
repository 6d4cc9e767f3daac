"""The `gpupool` entry point: help, and errors mapped to messages and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

from gpupool_cli import gpupool


def test_help_lists_every_verb_without_heavy_imports():
    done = gpupool("--help")
    assert done.returncode == 0
    for verb in (
        "server",
        "token",
        "run",
        "status",
        "train",
        "predict",
        "data",
        "submit",
        "jobs",
        "logs",
        "cancel",
        "kube",
    ):
        assert f"    {verb}" in done.stdout
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gpupool.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'fastapi', 'grpc', 'kubernetes', 'yaml') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr


def test_no_command_prints_help_and_exits_2():
    done = gpupool()
    assert done.returncode == 2
    assert "usage: gpupool" in done.stderr


def test_a_state_dir_that_cannot_be_made_is_a_message_not_a_traceback():
    done = gpupool(
        "status", env=dict(os.environ, GPUPOOL_STATE="/proc/gpupool-cannot-be-here", GPUPOOL_DEVICES="emulated:1x1GiB")
    )
    assert done.returncode == 1
    assert "gpupool: error:" in done.stderr and "/proc/gpupool-cannot-be-here" in done.stderr
    assert "Traceback" not in done.stderr
