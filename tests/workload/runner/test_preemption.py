"""`gpupool run` under preemption, as real processes on an embedded pool of two emulated GPUs
with two queues of quota 1 whose preemption stops (`--preempt kill`, what these tests are about; suspension
has tests/pooling/pool/test_suspend_e2e.py): team A borrows the second GPU, team B claims its quota back."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

import pytest
from waiting import events, holds, wait_for_events

from gpupool.core.errors import Preempted
from gpupool.pooling.isolation.env import ATTEMPT_ENV, PREEMPTED_ENV
from gpupool.pooling.isolation.proctree import alive

from .conftest import Pool

PREEMPTEE = str(Path(__file__).with_name("preemptee.py"))
FULL_CLI = [sys.executable, "-m", "gpupool.cli.main"]


def teams(pool: Pool) -> None:
    for name in ("a", "b"):
        done = subprocess.run(
            FULL_CLI + ["queue", "set", name, "--quota", "1", "--preempt", "kill"],
            env=pool.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr


def fill_with_team_a(pool: Pool, tmp_path: Path, *extra: str, mode: str = "") -> Dict[str, object]:
    """A's first job (within quota) and second job (borrowed), both holding; returns their handles."""
    first_log, borrowed_log = tmp_path / "a1.jsonl", tmp_path / "a2.jsonl"
    stop = tmp_path / "stop-a"
    first = pool.start("run", "--queue", "a", "--", sys.executable, PREEMPTEE, str(first_log), str(stop))
    wait_for_events(first_log, "start")
    borrowed = pool.start(
        "run", "--queue", "a", "--preempt-grace", "1", *extra, "--",
        sys.executable, PREEMPTEE, str(borrowed_log), str(stop), *([mode] if mode else []),
    )  # fmt: skip
    wait_for_events(borrowed_log, "start")
    return {"first": first, "borrowed": borrowed, "first_log": first_log, "borrowed_log": borrowed_log, "stop": stop}


@pytest.fixture
def pool2q(pool2: Pool) -> Pool:
    teams(pool2)
    return pool2


def test_a_preempted_command_gets_sigterm_and_the_runner_exits_8(pool2q: Pool, tmp_path: Path) -> None:
    a = fill_with_team_a(pool2q, tmp_path)
    started = time.time()
    b = pool2q.run("run", "--queue", "b", "--", sys.executable, "-c", "print('b ran')", timeout=60)
    assert b.returncode == 0, b.stderr
    assert "b ran" in b.stdout
    # printed, not bounded (a loaded machine sets it); that B ran at all shows the preemption
    print(f"B ran {time.time() - started:.1f} s after its launch (grace 1 s, reap margin 5 s)")
    borrowed = a["borrowed"]
    out, err = borrowed.communicate(timeout=30)  # type: ignore[union-attr]
    assert borrowed.returncode == Preempted.exit_code, err  # type: ignore[union-attr]
    assert "was preempted" in err and "SIGTERM, SIGKILL after 1s" in err and "--requeue" in err
    sigterms = events(a["borrowed_log"])  # type: ignore[arg-type]
    assert [e["event"] for e in sigterms] == ["start", "sigterm"]
    assert not alive(int(sigterms[0]["pid"]))  # type: ignore[arg-type]
    # A's job within its quota was never touched.
    assert [e["event"] for e in events(a["first_log"])] == ["start"]  # type: ignore[arg-type]
    Path(a["stop"]).touch()  # type: ignore[arg-type]
    first = a["first"]
    first.communicate(timeout=30)  # type: ignore[union-attr]
    assert first.returncode == 0  # type: ignore[union-attr]
    assert pool2q.status()["leases"] == []


def test_requeue_reruns_the_command_with_the_attempt_env_once_b_is_done(pool2q: Pool, tmp_path: Path) -> None:
    a = fill_with_team_a(pool2q, tmp_path, "--requeue")
    b_log, b_stop = tmp_path / "b.jsonl", tmp_path / "stop-b"
    b = pool2q.start("run", "--queue", "b", "--", sys.executable, PREEMPTEE, str(b_log), str(b_stop))
    wait_for_events(b_log, "start")
    borrowed_log: Path = a["borrowed_log"]  # type: ignore[assignment]
    wait_for_events(borrowed_log, "sigterm")
    # B holds the GPU: A's rerun waits in the queue (time for a wrong rerun, look after look)
    said = lambda: [e["event"] for e in events(borrowed_log)]  # noqa: E731
    holds(lambda: said() == ["start", "sigterm"], 1.0, "no rerun of A while B holds the GPU", detail=said)
    b_stop.touch()
    b.communicate(timeout=30)
    assert b.returncode == 0
    rerun = wait_for_events(borrowed_log, "start", count=2, timeout=30)[1]
    assert rerun["attempt"] == "2" and rerun["preempted"] == "1"
    first_start = events(borrowed_log)[0]
    assert first_start["attempt"] is None and first_start["preempted"] is None
    assert rerun["lease"] != first_start["lease"]
    Path(a["stop"]).touch()  # type: ignore[arg-type]
    for name in ("first", "borrowed"):
        proc = a[name]
        _, err = proc.communicate(timeout=30)  # type: ignore[union-attr]
        assert proc.returncode == 0, err  # type: ignore[union-attr]
    assert pool2q.status()["leases"] == []


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(pool2q: Pool, tmp_path: Path) -> None:
    a = fill_with_team_a(pool2q, tmp_path, mode="ignore-term")
    b = pool2q.run("run", "--queue", "b", "--", sys.executable, "-c", "pass", timeout=60)
    assert b.returncode == 0, b.stderr
    borrowed = a["borrowed"]
    _, err = borrowed.communicate(timeout=30)  # type: ignore[union-attr]
    ended = time.time()
    assert borrowed.returncode == Preempted.exit_code, err  # type: ignore[union-attr]
    log = events(a["borrowed_log"])  # type: ignore[arg-type]
    assert [e["event"] for e in log] == ["start", "sigterm"]  # never "done": SIGKILLed
    assert ended - float(log[1]["time"]) >= 0.9  # the grace (1 s) was given
    assert not alive(int(log[0]["pid"]))  # type: ignore[arg-type]
    Path(a["stop"]).touch()  # type: ignore[arg-type]
    a["first"].communicate(timeout=30)  # type: ignore[union-attr]


def test_bad_queue_flags_are_one_line_errors(pool: Pool) -> None:
    for flags, word in (
        (["--queue", "Team_A"], "Team_A"),
        (["--priority", "high"], "--priority"),
        (["--priority", "10000000"], "--priority"),
        (["--preempt-grace", "nan"], "--preempt-grace"),
        (["--preempt-grace", "-1"], "--preempt-grace"),
        (["--preempt-grace", "1e9"], "--preempt-grace"),
    ):
        done = pool.run("run", *flags, "--", "true")
        assert done.returncode == 2, (flags, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and word in lines[0], (flags, done.stderr)


def test_unknown_queue_is_refused(pool: Pool) -> None:
    done = pool.run("run", "-q", "--queue", "nobody", "--", "true")
    assert done.returncode == 2, done.stderr
    assert "nobody" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert ATTEMPT_ENV == "GPUPOOL_ATTEMPT" and PREEMPTED_ENV == "GPUPOOL_PREEMPTED"
