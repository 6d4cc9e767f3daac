"""The launcher stays light: each verb imports only its own module, and `gpupool run` / `status` /
`release` import nothing they do not use (issue 16), checked in `sys.modules` of a real process."""

from __future__ import annotations

import argparse
import ast
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest
from envs import clean_env, embedded_env
from workload_imports import EMBEDDED_NEVER

import gpupool
from gpupool.cli.main import COMMANDS, build_parser

SRC = Path(gpupool.__file__).resolve().parent

# The HTTP client is a small one on a socket: a plain-HTTP pool needs neither http.client nor ssl,
# nor the embedded pool's SQLite store, nor placement (one server places its own claims), nor the
# "idna" codec (an ASCII host name is resolved as bytes); nor the queue rules and device filters a
# plain claim does not use.
REMOTE_NEVER = (
    "ssl",
    "urllib.request",
    "http.client",
    "email",
    "logging",
    "sqlite3",
    "gpupool.pooling.pool",
    "gpupool.core.placement",
    "gpupool.core.queues",
    "gpupool.core.filters",
    "encodings.idna",
)

PROBE = """\
import sys
before = set(sys.modules)
from gpupool.cli.main import main
code = main(sys.argv[2:])
watched = sys.argv[1].split(",")
print("LOADED", ",".join(m for m in watched if m in sys.modules and m not in before))
sys.exit(code)
"""


def loaded(env: Dict[str, str], watched: tuple, *args: str) -> List[str]:
    """Which of `watched` a `gpupool ARGS` process imported (beyond the interpreter's own start)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(watched), *args], env=env, capture_output=True, text=True, timeout=60
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert last.startswith("LOADED"), done.stdout + done.stderr
    return [m for m in last[len("LOADED") :].strip().split(",") if m]


@pytest.fixture
def embedded(tmp_path) -> Dict[str, str]:
    """The env of an embedded pool of two emulated GPUs in tmp_path."""
    return embedded_env(tmp_path, "emulated:2x16GiB")


@pytest.mark.parametrize(
    "args",
    [
        ("run", "-q", "-n", "1", "-p", "0.5", "--", "true"),
        ("status",),
        ("status", "--json"),
        ("list-gpus",),
        ("release", "0123456789abcdef"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_embedded_pool_verbs_import_no_network_stack_and_no_logging(embedded, args):
    assert loaded(embedded, EMBEDDED_NEVER, *args) == []


def test_a_warning_still_reaches_stderr_in_the_cli_format(embedded):
    # A WARNING record makes gpupool.logs import logging and run the CLI's deferred basicConfig.
    env = dict(embedded, GPUPOOL_SERVER="embedded:" + embedded["GPUPOOL_STATE"], GPUPOOL_CONFIG="/nonexistent")
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert " gpupool.workload.client.resolve WARNING ignoring client config: client config /nonexistent" in done.stderr


def test_plain_http_pool_verbs_import_no_http_client_ssl_or_logging(running_server, tmp_path):
    env = clean_env(HOME=str(tmp_path), GPUPOOL_SERVER=running_server.url, GPUPOOL_TOKEN=running_server.token or "")
    assert loaded(env, REMOTE_NEVER, "run", "-q", "-p", "0.5", "--", "true") == []
    assert loaded(env, REMOTE_NEVER, "status", "--json") == []
    assert loaded(env, REMOTE_NEVER, "release", "0123456789abcdef") == []


def test_a_verb_imports_only_its_own_cli_module(embedded):
    others = tuple(f"gpupool.cli.{m}" for m in {m for m, _ in COMMANDS.values()} - {"run"})
    assert loaded(embedded, others, "run", "-q", "-n", "1", "-p", "0.5", "--", "true") == []


def test_the_command_table_matches_what_each_module_registers():
    """COMMANDS is what `--help` lists without importing the modules: each module must register
    exactly its commands there, with the same help line."""
    modules: Set[str] = {module for module, _ in COMMANDS.values()}
    for module in sorted(modules):
        parser = argparse.ArgumentParser()
        subparsers = parser.add_subparsers()
        importlib.import_module(f"gpupool.cli.{module}").register(subparsers)
        registered = {action.dest: action.help for action in subparsers._choices_actions}
        expected = {name: help_line for name, (owner, help_line) in COMMANDS.items() if owner == module}
        assert registered == expected, f"cli/{module}.py registers {registered}, COMMANDS says {expected}"


def test_full_parser_and_help_list_every_command():
    full = build_parser()
    lazy = build_parser(load=None)
    for parser in (full, lazy):
        text = parser.format_help()
        for name, (_, help_line) in COMMANDS.items():
            assert f"    {name}" in text and help_line.split()[0] in text


# Where os._exit stays: a forked child that must not run the parent's exit handlers (the guard's
# fork, a preexec_fn before exec, the clone3 child before exec).
FORKED_CHILDREN = {"workload/runner/guard.py", "workload/runner/prctl.py", "workload/runner/spawn.py"}


def _is_sys_modules(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "modules" and getattr(node.value, "id", "") == "sys"


def test_the_source_holds_no_start_up_trick():
    """Issue 24: nothing put into sys.modules, no codecache, typing's TYPE_CHECKING, os._exit only
    in forked children."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), where)):
            if isinstance(node, ast.Subscript) and _is_sys_modules(node.value) and not isinstance(node.ctx, ast.Load):
                found.append(f"{where}:{node.lineno}: sys.modules[...] assigned or deleted")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if _is_sys_modules(node.func.value) and node.func.attr in ("__setitem__", "setdefault", "update"):
                    found.append(f"{where}:{node.lineno}: sys.modules.{node.func.attr}")
                if node.func.attr == "_exit" and where not in FORKED_CHILDREN:
                    found.append(f"{where}:{node.lineno}: os._exit outside a forked child")
            elif isinstance(node, ast.ImportFrom) and any(a.name == "TYPE_CHECKING" for a in node.names):
                if node.module != "typing":
                    found.append(f"{where}:{node.lineno}: TYPE_CHECKING not from typing")
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "TYPE_CHECKING" for t in node.targets):
                found.append(f"{where}:{node.lineno}: a TYPE_CHECKING of its own")
            elif isinstance(node, ast.Name) and node.id == "codecache":
                found.append(f"{where}:{node.lineno}: codecache")
    assert found == []
    assert not (SRC / "codecache.py").exists()
