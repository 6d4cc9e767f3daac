"""Issue 36 item 8: a mistyped verb or flag is answered, through the real CLI, with the nearest one
(argparse does so only from Python 3.14), still exit 2 and no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["stauts"], "did you mean 'status'?"),
        (["run", "--gpus", "2", "--", "true"], "'--gpus' (did you mean '-n/--num-gpus'?)"),
        (["run", "-g", "2", "--", "true"], "'-g' (did you mean '-n/--num-gpus'?)"),
        (["status", "--jsno"], "'--jsno' (did you mean '--json'?)"),
        (["claim", "cancle", "3"], "did you mean 'cancel'?"),
        (["queue", "shwo"], "did you mean 'show'?"),
    ],
)
def test_a_typo_gets_the_nearest_verb_or_flag(argv: list, hint: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gpupool", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert hint in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith(("gpupool: error:", f"gpupool {argv[0]}: error:"))


def test_a_word_like_no_verb_gets_no_guess() -> None:
    done = subprocess.run([sys.executable, "-m", "gpupool", "xyzzy"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'xyzzy'" in done.stderr and "did you mean" not in done.stderr
