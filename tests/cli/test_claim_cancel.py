"""Issue 36 item 3: `gpupool claim cancel CLAIM_ID`, as `scancel` on a pending job, on a real server
with two tenants and real waiting `gpupool run`s: a stranger is refused, the holder and an admin
may cancel, and the waiting run exits ClaimCancelled.exit_code with one line naming who, its
command never started; an unknown id is named (exit 4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

from tenants import gpupool_as
from waiting import wait_until

from gpupool.core.errors import ClaimCancelled, Forbidden, NotFound


def test_cancel_a_waiting_claim_through_a_server(running_server, tmp_path: Path) -> None:
    server = running_server
    env = server.client_env(tmp_path)
    tokens = server.make_tokens("alice", "bob")
    server.hold_whole_gpus(2)
    flags = tmp_path / "flags"
    flags.mkdir()
    url = ["--server", server.url]

    def show() -> List[dict]:
        done = gpupool_as(env, tokens["alice"], "queue", "show", "--json", *url)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["waiting"]

    def start(label: str) -> subprocess.Popen:
        count = len(show()) + 1
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "run", "-q", *url, "--wait", "600", "-p", "1", "--label", label]
            + ["--", "touch", str(flags / label)],
            env=dict(env, GPUPOOL_TOKEN=tokens["alice"]),
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: len(show()) == count, 60, f"{label} waiting")
        return proc

    runs: List[subprocess.Popen] = []
    try:
        runs += [start("w1"), start("w2")]
        ids = {w["label"]: str(w["ticket"]) for w in show()}

        stranger = gpupool_as(env, tokens["bob"], "claim", "cancel", ids["w1"], *url)
        assert stranger.returncode == Forbidden.exit_code, stranger.stderr
        assert stranger.stderr.count("\n") == 1 and "'alice', not 'bob'" in stranger.stderr
        assert len(show()) == 2

        mine = gpupool_as(env, tokens["alice"], "claim", "cancel", ids["w1"], *url)
        assert mine.returncode == 0, mine.stderr
        assert f"claim {ids['w1']}" in mine.stderr and "cancelled" in mine.stderr
        assert runs[0].wait(60) == ClaimCancelled.exit_code
        told = runs[0].stderr.read() if runs[0].stderr else ""
        assert f"claim {ids['w1']}" in told and "cancelled by its holder 'alice'" in told, told
        assert [w["label"] for w in show()] == ["w2"]

        by_admin = gpupool_as(env, server.token or "", "claim", "cancel", ids["w2"], *url)
        assert by_admin.returncode == 0, by_admin.stderr
        assert runs[1].wait(60) == ClaimCancelled.exit_code
        told = runs[1].stderr.read() if runs[1].stderr else ""
        assert "cancelled by an admin" in told, told
        assert show() == []
        assert not list(flags.iterdir())  # neither command ran

        unknown = gpupool_as(env, tokens["alice"], "claim", "cancel", ids["w1"], *url)  # gone already
        assert unknown.returncode == NotFound.exit_code, unknown.stderr
        assert unknown.stderr.count("\n") == 1 and repr(ids["w1"]) in unknown.stderr
    finally:
        for proc in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_cancel_on_an_embedded_pool(tmp_path: Path) -> None:
    """The same on a pool without a server: the waiting run polls its ticket in its own process."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("GPUPOOL_")}
    env.update(HOME=str(tmp_path), GPUPOOL_DEVICES="emulated:1x16G")
    state = ["--state", str(tmp_path / "state")]
    blocker = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "run", "-q", *state, "-p", "1", "--", "sleep", "600"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    waiter = None
    try:

        def listed() -> List[dict]:
            done = subprocess.run(
                [sys.executable, "-m", "gpupool", "queue", "show", "--json", *state],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)["waiting"]

        def status_leases() -> int:
            done = subprocess.run(
                [sys.executable, "-m", "gpupool", "status", "--json", *state],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            return len(json.loads(done.stdout).get("leases", [])) if done.returncode == 0 else 0

        wait_until(lambda: status_leases() == 1, 60, "the blocker's lease")
        waiter = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "run", "-q", *state, "--wait", "600", "-p", "1", "--", "true"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: len(listed()) == 1, 60, "the second run waiting")
        ticket = str(listed()[0]["ticket"])
        done = subprocess.run(
            [sys.executable, "-m", "gpupool", "claim", "cancel", ticket, *state],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert waiter.wait(60) == ClaimCancelled.exit_code
        told = waiter.stderr.read() if waiter.stderr else ""
        assert f"claim {ticket}" in told and "cancelled by an admin" in told, told
    finally:
        for proc in (blocker, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
