"""`gpupool` entry point: builds the parser from the verb modules and maps errors to exit codes.

Each verb module exposes `register(subparsers)`, which adds its subcommands
and sets `func=handler` (handler(args) -> exit code). Verb modules import
heavy libraries inside their handlers, so `gpupool --help` and the
workload-side verbs work with the standard library alone.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Iterable, List, Optional

from .. import __version__
from ..core.errors import GpupoolError

# Order here is the order of `gpupool --help`.
VERB_MODULES: List[str] = [
    "server",
    "token",
    "run",
    "status",
    "train",
    "predict",
    "data",
    "submit",
    "jobs",
    "kube",
]


def build_parser(modules: Iterable[str] = ()) -> argparse.ArgumentParser:
    """The `gpupool` parser with the subcommands of `modules` (default: all)."""
    parser = argparse.ArgumentParser(
        prog="gpupool",
        description="Pool GPUs and share them fractionally between training jobs.",
    )
    parser.add_argument("--version", action="version", version=f"gpupool {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in modules or VERB_MODULES:
        importlib.import_module(f"{__package__}.{name}").register(subparsers)
    return parser


def main(argv: Optional[List[str]] = None, modules: Iterable[str] = ()) -> int:
    """Run one `gpupool` command and return its exit code."""
    parser = build_parser(modules)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except GpupoolError as err:
        print(f"gpupool: error: {err.message}", file=sys.stderr)
        return err.exit_code
    except OSError as err:
        # The machine said no (a state dir that cannot be made, a full disk ...):
        # not a bug in gpupool, so the reason and the path, not a traceback.
        where = f" ({err.filename})" if err.filename else ""
        print(
            f"gpupool: error: {err.strerror or err}{where}: check the path, its permissions and free space",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
