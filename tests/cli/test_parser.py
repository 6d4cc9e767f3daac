"""gpupool.cli.parser: the help width as shutil reads it, without importing shutil."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpupool.cli.parser import DEFAULT_COLUMNS, terminal_columns


@pytest.mark.parametrize("value, expected", [("100", 100), ("57", 57)])
def test_columns_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("COLUMNS", value)
    assert terminal_columns() == expected


@pytest.mark.parametrize("value", ["", "wide", "0", "-3"])
def test_a_useless_columns_value_falls_back_to_the_terminal_or_80(monkeypatch, value):
    monkeypatch.setenv("COLUMNS", value)
    # pytest captures stdout: no terminal there, so the fallback
    assert terminal_columns() == DEFAULT_COLUMNS


@pytest.mark.parametrize("columns", [50, 120])
def test_run_help_is_wrapped_to_the_width_in_columns(tmp_path, columns):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(HOME=str(tmp_path), COLUMNS=str(columns))
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "run", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # the options' lines (argparse keeps the raw description and epilog as written)
    options = done.stdout.split("options:")[1].split("examples:")[0].splitlines()
    assert max(len(line) for line in options) <= columns - 2
    if columns > 100:  # a wide terminal gets wide lines, not the 80-column default
        assert max(len(line) for line in options) > DEFAULT_COLUMNS
