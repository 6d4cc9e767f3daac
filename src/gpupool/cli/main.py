"""`gpupool` entry point: lists every command, imports only the one that runs, maps errors to exit codes.

`COMMANDS` names each command's module and its line of `gpupool --help`; the module is imported
only when its command runs (or for `gpupool CMD --help`), and its `register(subparsers)` adds
its real subcommands and sets `func=handler` (handler(args) -> exit code). A new verb is one
line in `COMMANDS`. Verb modules import heavy libraries inside their handlers, so
`gpupool --help` and the workload-side verbs work with the standard library alone, and
`gpupool run` imports only the modules it uses.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING

from .. import __version__, logs
from ..core.errors import GpupoolError, exit_codes_help

if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, NoReturn, Optional, Sequence, Tuple

# Command -> (cli module that registers it, its line in `gpupool --help`); the order here is the
# order of `gpupool --help`. tests/cli/test_main.py checks that each module registers exactly
# its commands here, with the same help line.
COMMANDS: Dict[str, Tuple[str, str]] = {
    "server": ("server", "serve this machine's GPUs to clients over HTTP(S)"),
    "token": ("token", "create client tokens and bundles"),
    "config": ("config", "the pool, token and CA a client uses, and where each comes from"),
    "run": ("run", "run a command on N GPUs, each a fraction or a memory size"),
    "status": ("status", "devices, their allocation and the live leases"),
    "list-gpus": ("status", "the pool's GPUs"),
    "release": ("status", "release a lease now (yours, or any as admin)"),
    "suspend": ("status", "park a lease's GPU state in host memory and free its GPUs (yours, or any as admin)"),
    "resume": ("status", "bring a suspended lease back when there is room (yours, or any as admin)"),
    "queue": ("queue", "team queues: quotas in GPUs, borrowing weights, limits"),
    "claim": ("claim", "hold, release, cancel or reprioritise a waiting claim (yours, or any as admin)"),
    "usage": ("usage", "GPU-hours per queue, holder or label since a time"),
    "train": ("train", "train an image classifier on DIR/<class>/*.jpg"),
    "predict": ("predict", "classify images with a trained model"),
    "data": ("data", "prepare image data sets as DIR/<class>/*.jpg"),
    "submit": ("submit", "run a (distributed) training job from a YAML spec"),
    "jobs": ("jobs", "list submitted jobs with their state"),
    "logs": ("jobs", "print a job's logs"),
    "cancel": ("jobs", "stop a job and free its GPUs"),
    "kube": ("kube", "Kubernetes: webhooks + scheduler extender, node agent, certificates"),
    "simulate": ("simulate", "replay a cluster and a workload through the placement policies"),
    "kernel": ("kernel", "Jupyter kernels on a GPU share that is given back while they idle"),
    "bench": ("bench", "throughput reports: scaling over GPUs, sharing one GPU"),
    "doctor": ("doctor", "check a pool's invariants and its database"),
    "backup": ("doctor", "copy a pool's database with SQLite's online backup"),
    "restore": ("doctor", "replace a pool's database with a backup"),
}
# The stdlib verbs of the workload side (also gpupool-run.pyz): they start before every job, so
# `logging` is imported and configured only when a record is shown (see gpupool.logs).
WORKLOAD_MODULES: Tuple[str, ...] = ("run", "status")
ALL = "*"


def build_parser(modules: Iterable[str] = (), load: Optional[str] = ALL) -> argparse.ArgumentParser:
    """The `gpupool` parser: every command of `modules` (default: all) listed with its help line.

    Only the module of command `load` is imported and registers its real subcommands (ALL: every
    module); the other commands are placeholders, there only for help and for the error that
    lists them, so a known `load` gets none (None or an unknown name: all placeholders).
    """
    parser = SuggestingParser(
        prog="gpupool",
        description="Pool GPUs and share them fractionally between training jobs.",
        epilog=exit_codes_help(),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpupool {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    only = set(modules)
    chosen = COMMANDS[load][0] if load in COMMANDS else None
    registered = set()
    for name, (module, help_line) in COMMANDS.items():
        if only and module not in only:
            continue
        if load == ALL or module == chosen:
            if module not in registered:  # one module may register several commands
                registered.add(module)
                importlib.import_module(f"{__package__}.{module}").register(subparsers)
        elif chosen is None:
            subparsers.add_parser(name, help=help_line, add_help=False)
    _state_exit_codes(parser, exit_codes_help())
    return parser


class SuggestingParser(argparse.ArgumentParser):
    """argparse's parser that answers a typo with the nearest verb or flag (`gpupool stauts`: did
    you mean 'status'?), as argparse does only from Python 3.14; still exit 2. Subparsers are of
    this class too (add_subparsers makes them of their parent's)."""

    def error(self, message: str) -> NoReturn:
        import re

        found = re.match(r"(argument .*: invalid choice: )('.*?') \(choose from (.*)\)$", message, re.S)
        if found:
            choices = re.findall(r"'([^']*)'", found.group(3))
            near = _nearest(found.group(2).strip("'"), choices)
            hint = f"did you mean {near!r}? " if near else ""
            message = f"{found.group(1)}{found.group(2)}: {hint}(choose from {found.group(3)})"
        super().error(message)

    def parse_args(self, args: Optional[Sequence[str]] = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            deepest = _chosen(self, parsed)
            hints = []
            for word in extras:
                near = _nearest_flag(deepest, word) if word.startswith("-") else None
                hints.append(f"{word!r} (did you mean {near!r}?)" if near else repr(word))
            deepest.error(f"unrecognized arguments: {' '.join(hints)}")
        return parsed


def _nearest(word: str, choices: Sequence[str]) -> Optional[str]:
    import difflib

    near = difflib.get_close_matches(word, choices, n=1)
    return near[0] if near else None


def _chosen(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the verb `parsed` names: its flags are the ones a typo was meant to be."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices.get(getattr(parsed, action.dest or "", None) or "")
            if sub is not None:
                return _chosen(sub, parsed)
    return parser


def _nearest_flag(parser: argparse.ArgumentParser, word: str) -> Optional[str]:
    """The flag of `parser` nearest to `word` (`--gpus`: '-n/--num-gpus'): by spelling, else the
    first whose help names a word like it (`-g`: a word starting with g, 'GPUs' of -n)."""
    typed = word.split("=", 1)[0]
    by_flag = {flag: action for action in parser._actions for flag in action.option_strings}
    near = _nearest(typed, list(by_flag))
    action = by_flag[near] if near else None
    if action is None:
        stem = typed.lstrip("-").lower().rstrip("s")
        for candidate in parser._actions:
            words = [w.strip("(),.:;'`").lower() for w in (candidate.help or "").split()]
            if not candidate.option_strings or candidate.help == argparse.SUPPRESS or not stem:
                continue
            if any(w.startswith(stem) if len(stem) == 1 else w.rstrip("s") == stem for w in words):
                action = candidate
                break
    return "/".join(action.option_strings) if action is not None else None


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but a text of several lines (the exit codes, examples) is kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _state_exit_codes(parser: argparse.ArgumentParser, codes: str) -> None:
    """Every registered verb's --help (subcommands' too) ends with the exit codes (core.errors)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in set(action.choices.values()):
            if not sub.add_help:  # a placeholder of an unloaded command: no help of its own
                continue
            sub.epilog = f"{sub.epilog.rstrip()}\n\n{codes}" if sub.epilog else codes
            if sub.formatter_class is argparse.HelpFormatter:
                sub.formatter_class = _HelpFormatter
            _state_exit_codes(sub, codes)


def command_of(argv: Sequence[str]) -> Optional[str]:
    """The command `argv` names: its first word that is not an option (`gpupool`'s own options
    take no value); None when there is none, or when an option other than -v comes first
    (`-h` lists every command)."""
    for word in argv:
        if not word.startswith("-"):
            return word
        if word != "--verbose" and word.strip("v") != "-":
            return None
    return None


def main(argv: Optional[List[str]] = None, modules: Iterable[str] = ()) -> int:
    """Run one `gpupool` command (`argv`, default the process's arguments) and return its exit code."""
    words = sys.argv[1:] if argv is None else list(argv)
    command = command_of(words)
    parser = build_parser(modules, load=command)
    if command is None:  # maybe behind an option form command_of does not know: find it, load its module
        command = parser.parse_known_args(words)[0].command
        if command is not None:
            parser = build_parser(modules, load=command)
    args = parser.parse_args(words)
    verbosity = min(args.verbose, 2)

    def setup_logging() -> None:
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logs.escaping_formatter())  # client text never forges a log line
        logging.basicConfig(level=(logging.WARNING, logging.INFO, logging.DEBUG)[verbosity], handlers=[handler])

    if verbosity or COMMANDS.get(command or "", ("",))[0] not in WORKLOAD_MODULES:
        logs.defer(None)
        setup_logging()
    else:
        logs.defer(setup_logging)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except GpupoolError as err:
        print(f"gpupool: error: {err.message}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:
        return _reader_gone()
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


def _reader_gone() -> int:
    """stdout's reader went away (`gpupool jobs | head -1`): end quietly with the status of a
    program killed by SIGPIPE, and point stdout at /dev/null so the exit's flush says nothing."""
    import os
    import signal

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
