"""A lease that ends under its command ends the command (issue 34, item 2): a release by its owner
or by an admin, or its token revoked, reaches `gpupool run` through the watch it long-polls, and
the command's whole tree is ended then, not at the next heartbeat (a third of the TTL later).

Real processes: a `gpupool server` with tokens, `gpupool run -- sleep MARK` under a named token,
`gpupool release` and `gpupool token revoke` as separate commands; and the same on an embedded pool.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import httpx
import pytest
from marked import kill_all, marked, marker
from waiting import wait_until

from gpupool.core.errors import LeaseLost

from .conftest import Pool

CLI = [sys.executable, "-m", "gpupool"]
# The run's TTL: long, so that only the watch (never a missed heartbeat) can end the command soon.
TTL_S = "60"
# How long the command may outlive its lease's end here: a condition, not a speed (the benchmark
# benchmarks/bench_release.py measures the speed).
GONE_WAIT_S = 10.0


def named_token(server, name: str) -> str:
    answer = httpx.post(f"{server.url}/v1/tokens", json={"name": name}, headers=server.headers())
    assert answer.status_code == 201, answer.text
    return str(answer.json()["token"])


def start_run(env: Dict[str, str], *where: str) -> Tuple[subprocess.Popen, str, str]:
    """`gpupool run -- sleep MARK` (the whole tree: a shell with a background sleep too); (runner,
    mark, lease id) once both sleeps run and the lease is live."""
    mark = marker()
    command = ["sh", "-c", f"sleep {mark} & sleep {mark}"]
    runner = subprocess.Popen(
        CLI + ["run", *where, "-p", "0.25", "--ttl", TTL_S, "--", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: len(marked(mark, "sleep")) >= 2 or runner.poll() is not None, 20, "the command started")
    assert runner.poll() is None, runner.communicate()[1]
    lines: List[str] = []
    return runner, mark, lease_of(runner, lines)


def lease_of(runner: subprocess.Popen, lines: List[str]) -> str:
    """The lease id from the runner's 'Locked ... as lease ID,' line (read from its stderr)."""
    assert runner.stderr is not None
    while True:
        line = runner.stderr.readline()
        assert line, "".join(lines)
        lines.append(line)
        if " as lease " in line:
            return line.split(" as lease ", 1)[1].split(",", 1)[0]


def ended(runner: subprocess.Popen, mark: str) -> str:
    """Wait for the command's tree to go and the runner to exit; its stderr."""
    try:
        try:
            wait_until(lambda: not marked(mark, "sleep"), GONE_WAIT_S, "the command's processes gone")
        except AssertionError as failed:
            runner.kill()
            raise AssertionError(f"{failed}; the runner said: {runner.communicate(timeout=10)[1]}") from None
        _, err = runner.communicate(timeout=GONE_WAIT_S)
        return err
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=10)
        kill_all(marked(mark, "sleep"))


@pytest.fixture
def server(server_factory):
    # A server TTL far above the test's waits: no reaper or expiry can be what ends a lease here.
    return server_factory("--ttl", TTL_S)


def client_env(server, tmp_path: Path, token: str) -> Dict[str, str]:
    env = server.client_env(tmp_path)
    env.update(GPUPOOL_TOKEN=token, GPUPOOL_SERVER=server.url)
    return env


@pytest.mark.parametrize("by", ["owner", "admin"])
def test_a_release_ends_the_command_and_says_who_released_it(server, tmp_path, by):
    alice = named_token(server, "alice")
    runner, mark, lease = start_run(client_env(server, tmp_path, alice))
    releaser = client_env(server, tmp_path, alice if by == "owner" else server.token or "")
    done = subprocess.run(CLI + ["release", lease], env=releaser, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    err = ended(runner, mark)
    assert runner.returncode == LeaseLost.exit_code, err
    said = "released by its owner" if by == "owner" else "released by an admin"
    assert lease in err and said in err, err
    assert "ending the command" in err, err


def test_a_revoked_token_ends_its_commands(server, tmp_path):
    bob = named_token(server, "bob")
    runner, mark, lease = start_run(client_env(server, tmp_path, bob))
    admin = client_env(server, tmp_path, server.token or "")
    token_file = server.args[server.args.index("--token-file") + 1]
    revoke = ["token", "revoke", "bob", "--server", server.url, "--admin-token-file", token_file]
    done = subprocess.run(CLI + revoke, env=admin, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    err = ended(runner, mark)
    assert runner.returncode == LeaseLost.exit_code, err
    # Whichever call of the runner's comes first says it: the watch waiting when the pool ended the
    # lease reads that the token was revoked; a call made after it is refused the token.
    assert lease in err and ("token 'bob' was revoked" in err or "the token is not valid" in err), err
    # The pool ended the lease with its token: nothing of it is left to expire later.
    leases = httpx.get(f"{server.url}/v1/leases", headers=server.headers()).json()["leases"]
    assert lease not in [row["id"] for row in leases]


def test_a_release_on_the_embedded_pool_ends_the_command(pool: Pool):
    runner, mark, lease = start_run(pool.env)
    done = subprocess.run(CLI + ["release", lease], env=pool.env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    err = ended(runner, mark)
    assert runner.returncode == LeaseLost.exit_code, err
    assert lease in err and "released by its owner" in err, err
