"""Issue 36 item 4: a refused token (401, 403) exits Unauthorized.exit_code, apart from a usage
error's 2, through the real CLI; every verb's --help (subcommands' too) states the exit codes, from
the one definition in core/errors.py."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import httpx
import pytest
from gpupool_cli import gpupool

from gpupool.cli.main import COMMANDS, build_parser
from gpupool.core.errors import Forbidden, InvalidInput, Unauthorized, exit_codes_help


def test_a_refused_token_has_its_own_exit_code(running_server, tmp_path: Path) -> None:
    server = running_server
    env = server.client_env(tmp_path)
    assert Unauthorized.exit_code == Forbidden.exit_code != InvalidInput.exit_code == 2
    wrong = gpupool("status", "--server", server.url, env=dict(env, GPUPOOL_TOKEN="not-a-token-of-this-pool"))
    assert wrong.returncode == Unauthorized.exit_code, wrong.stderr
    assert wrong.stderr.count("\n") == 1 and "Traceback" not in wrong.stderr
    answer = httpx.post(f"{server.url}/v1/tokens", json={"name": "carol"}, headers=server.headers())
    carol = dict(env, GPUPOOL_TOKEN=answer.json()["token"])
    refused = gpupool("queue", "set", "team-x", "--quota", "1", "--server", server.url, env=carol)  # an admin call
    assert refused.returncode == Forbidden.exit_code, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    usage = gpupool("status", "--server", server.url, "--no-such-flag", env=carol)
    assert usage.returncode == 2 and "--no-such-flag" in usage.stderr


def _parsers(
    parser: argparse.ArgumentParser, path: Tuple[str, ...] = ()
) -> Iterator[Tuple[Tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _parsers(sub, (*path, name))


def test_every_verb_help_states_the_exit_codes() -> None:
    codes = exit_codes_help()
    assert "\n  10  " in codes and "\n  2   " in codes and "\n  4   " in codes
    seen: List[str] = []
    for path, parser in _parsers(build_parser()):
        text = parser.format_help()
        assert codes.strip() in text, " ".join(path)
        seen.append(" ".join(path))
    assert set(COMMANDS) <= set(seen) and "claim cancel" in seen and "queue set" in seen


@pytest.mark.parametrize("verb", ["doctor", "run", "claim"])
def test_help_through_the_cli(verb: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gpupool", verb, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "exit codes:\n" in done.stdout
    for code in (2, 4, 10):
        assert f"\n  {code:<3} " in done.stdout, (verb, code)
