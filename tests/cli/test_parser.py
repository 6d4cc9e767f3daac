"""`gpupool` help is argparse's own: wrapped to the terminal's width ($COLUMNS), as argparse reads it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from envs import clean_env

# argparse's width where $COLUMNS is unset and stdout no terminal (shutil.get_terminal_size's fallback)
FALLBACK_COLUMNS = 80


@pytest.mark.parametrize("columns", [50, 120])
def test_run_help_is_wrapped_to_the_width_in_columns(tmp_path, columns):
    env = clean_env(HOME=str(tmp_path), COLUMNS=str(columns))
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "run", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # the options' lines (argparse keeps the raw description and epilog as written)
    options = done.stdout.split("options:")[1].split("examples:")[0].splitlines()
    assert max(len(line) for line in options) <= columns - 2
    if columns > 100:  # a wide terminal gets wide lines, not the 80-column default
        assert max(len(line) for line in options) > FALLBACK_COLUMNS


@pytest.mark.parametrize("group", ["claim", "config", "queue", "token", "kube", "bench"])
def test_a_group_without_its_subcommand_prints_its_help_and_exits_2(tmp_path, group):
    env = clean_env()
    env["HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "gpupool", group], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"usage: gpupool {group} "), done.stderr
