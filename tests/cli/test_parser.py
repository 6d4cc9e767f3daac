"""`gpupool` help is argparse's own: wrapped to the terminal's width ($COLUMNS), as argparse reads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# argparse's width where $COLUMNS is unset and stdout no terminal (shutil.get_terminal_size's fallback)
FALLBACK_COLUMNS = 80


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
        assert max(len(line) for line in options) > FALLBACK_COLUMNS
