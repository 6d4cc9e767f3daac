"""The `gpupool` argument parser class: argparse's, with the help width read without `shutil`.

argparse makes a help formatter at every `add_argument` (to check the metavar) and each one asks
`shutil.get_terminal_size()` for the width; importing `shutil` for that cost `gpupool run` about
a millisecond at every start. `Parser` gives its formatters the width itself, read as shutil
reads it: $COLUMNS, else the terminal on stdout, else 80 columns.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Callable, Type

DEFAULT_COLUMNS = 80


def terminal_columns() -> int:
    """The terminal's width in columns, as `shutil.get_terminal_size().columns` answers it."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0 and sys.__stdout__ is not None:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (ValueError, OSError):  # a closed stdout, or not a terminal
            columns = 0
    return columns or DEFAULT_COLUMNS


def sized(formatter_class: Type[argparse.HelpFormatter]) -> Callable[..., argparse.HelpFormatter]:
    """`formatter_class`, made with the terminal's width (argparse keeps 2 columns free)."""

    def make(prog: str) -> argparse.HelpFormatter:
        return formatter_class(prog, width=terminal_columns() - 2)

    return make


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose formatters get the width from `terminal_columns`; subparsers made
    with `add_subparsers` are of this class too (argparse uses the parent's class)."""

    def __init__(self, formatter_class: Type[argparse.HelpFormatter] = argparse.HelpFormatter, **kwargs: Any) -> None:
        super().__init__(formatter_class=sized(formatter_class), **kwargs)
