"""A verb group (`gpupool queue`, `token`, `claim` ...) run without its subcommand."""

from __future__ import annotations

import argparse
import sys

from ..core.errors import InvalidInput


def help_when_bare(parser: argparse.ArgumentParser) -> None:
    """Make `parser`, given no subcommand, print its own help on stderr and exit as a usage error."""

    def bare(_args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return InvalidInput.exit_code

    parser.set_defaults(func=bare)
