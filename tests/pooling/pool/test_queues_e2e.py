"""Issue 17 end to end: two teams share two emulated GPUs through a real server.

Queues a and b have quota 1 each. Team A fills both GPUs (the second on loan); team B's job
preempts the loan and starts within the grace + 2 s; A's preempted job (`--requeue`) runs again,
with GPUPOOL_ATTEMPT=2, as soon as B's job ends; `gpupool usage --json` accounts both teams'
GPU-seconds between what the jobs certainly ran and the runners' lifetimes (less A's wait for
its rerun); kill -9 of a runner or of the server in the middle of a preemption loses no lease and
leaves no process running. How fast B starts and A reruns is printed, not asserted: a loaded
machine sets those figures, the order of events is what must hold.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from tests.conftest import ServerProcess, start_server
from tests.gpupool_cli import gpupool
from tests.waiting import events, holds, wait_dead, wait_for_events

PREEMPTEE = str(Path(__file__).parents[2] / "workload" / "runner" / "preemptee.py")
CLI = [sys.executable, "-m", "gpupool.cli.main"]
GRACE_S = 1.0
# B claims without --wait: a claim within its quota waits for the borrowers it preempts anyway.
B_FLAGS: Tuple[str, ...] = ()

pytestmark = pytest.mark.slow


class Runner:
    """A `gpupool run` child whose stderr lines are timestamped as they come, and the wall-clock
    times it was launched and seen to end (no lease of it can lie outside those)."""

    def __init__(self, args: List[str], env: Dict[str, str]) -> None:
        self.launched = time.time()
        self.ended: Optional[float] = None
        self.proc = subprocess.Popen(
            CLI + ["run", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.lines: List[Tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout)
        if self.ended is None:
            self.ended = time.time()
        self._reader.join(5)
        return code

    @property
    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def lifetime(self) -> float:
        """Seconds from its launch to its end as seen: more than any lease it held lasted."""
        assert self.ended is not None, "wait() for the runner first"
        return self.ended - self.launched

    def released_at(self) -> List[float]:
        """When each "Released GPUs" line was seen: after that release was done."""
        return [at for at, line in self.lines if "Released GPUs" in line]


def ran_seconds(log: Path) -> float:
    """Seconds the preemptee certainly ran, summed over its attempts: from each "start" to the
    "sigterm" or "done" that follows it (all within the attempt's lease)."""
    total = 0.0
    started: Optional[float] = None
    for event in events(log):
        if event["event"] == "start":
            started = float(event["time"])  # type: ignore[arg-type]
        elif started is not None:
            total += float(event["time"]) - started  # type: ignore[arg-type]
            started = None
    return total


def leases(env: Dict[str, str]) -> List[Dict[str, object]]:
    return list(json.loads(gpupool("status", "--json", env=env, check=True).stdout)["leases"])


class Teams:
    """A server with queues a and b (quota 1 each), and the env of a runner against it."""

    def __init__(self, server: ServerProcess, tmp_path: Path) -> None:
        self.server = server
        self.tmp = tmp_path
        self.env = server.client_env(tmp_path)
        self.env["GPUPOOL_SERVER"] = server.url
        for name in ("a", "b"):
            # requeue: these tests follow the SIGTERM and the rerun (suspension has tests of its own)
            gpupool("queue", "set", name, "--quota", "1", "--preempt", "requeue", env=self.env, check=True)

    def job(self, name: str, queue: str, *flags: str, mode: str = "") -> Tuple[Runner, Path, Path]:
        """A runner of the preemptee in `queue`; its event log and stop file."""
        log, stop = self.tmp / f"{name}.jsonl", self.tmp / f"{name}.stop"
        args = ["--queue", queue, *flags, "--", sys.executable, PREEMPTEE, str(log), str(stop)]
        return Runner(args + ([mode] if mode else []), self.env), log, stop


@pytest.fixture
def teams(server_factory, tmp_path: Path) -> Teams:
    return Teams(server_factory(), tmp_path)


def test_b_takes_its_quota_back_and_a_reruns_after_b_and_usage_adds_up(teams: Teams) -> None:
    first, first_log, first_stop = teams.job("a1", "a")
    wait_for_events(first_log, "start")
    loan, loan_log, loan_stop = teams.job("a2", "a", "--requeue", "--preempt-grace", f"{GRACE_S:g}")
    wait_for_events(loan_log, "start")
    time.sleep(1.0)  # A holds both GPUs a while: GPU-seconds to account (the workload)

    b_launched = time.time()
    b, b_log, b_stop = teams.job("b", "b", *B_FLAGS)
    b_start = wait_for_events(b_log, "start")[0]
    # Printed, not asserted (a loaded machine sets it): issue 17's target is the grace + 2 s.
    print(f"B's job started {float(b_start['time']) - b_launched:.2f} s after its launch (grace {GRACE_S:g} s)")
    term = wait_for_events(loan_log, "sigterm")[0]
    assert float(term["time"]) <= float(b_start["time"])  # A's loan was stopped first (its stop file never came)

    # B holds its GPU a while: A's rerun waits (it cannot start while B holds it), look after look
    said = lambda: [e["event"] for e in events(loan_log)]  # noqa: E731
    holds(lambda: said() == ["start", "sigterm"], 1.5, "no rerun of A while B holds its GPU", detail=said)
    b_stop.touch()
    b_stopped = time.time()
    assert b.wait() == 0, b.stderr
    rerun = wait_for_events(loan_log, "start", count=2)[1]
    assert rerun["attempt"] == "2" and rerun["preempted"] == "1"
    (b_done,) = [e for e in events(b_log) if e["event"] == "done"]
    print(f"A's rerun started {float(rerun['time']) - float(b_done['time']):.2f} s after B's job ended")
    assert float(rerun["time"]) > float(b_done["time"]), "A's rerun starts only once B's job has ended"
    assert [e["event"] for e in events(first_log)] == ["start"], "A's job within quota is never preempted"
    time.sleep(1.0)  # the rerun holds its GPU a while: GPU-seconds to account
    loan_stop.touch()
    first_stop.touch()
    assert loan.wait() == 0, loan.stderr
    assert first.wait() == 0, first.stderr
    assert leases(teams.env) == []

    usage = json.loads(gpupool("usage", "--since", "1h", "--json", env=teams.env, check=True).stdout)
    measured = {row["key"]: float(row["gpu_seconds"]) for row in usage["usage"]}
    # Bounds that hold however slow the machine: at least what the jobs certainly ran, at most the
    # runners' lifetimes, less the loan's wait for its rerun (from its first release, seen, until
    # B was told to stop: B's GPU was not free before that).
    ran = {"a": ran_seconds(first_log) + ran_seconds(loan_log), "b": ran_seconds(b_log)}
    waited = max(0.0, b_stopped - loan.released_at()[0])
    lived = {"a": first.lifetime() + loan.lifetime() - waited, "b": b.lifetime()}
    for team in ("a", "b"):
        print(
            f"team {team}: {measured[team]:.3f} GPU-s accounted, ran {ran[team]:.3f}, runners lived {lived[team]:.3f}"
        )
        assert ran[team] > 1.0
        assert ran[team] <= measured[team] <= lived[team], (team, ran, measured, lived)


def test_kill_9_of_a_runner_while_it_is_being_preempted(teams: Teams) -> None:
    first, first_log, first_stop = teams.job("a1", "a")
    wait_for_events(first_log, "start")
    # Ignores SIGTERM: the preemption is still in its grace when the runner dies.
    loan, loan_log, _ = teams.job("a2", "a", "--preempt-grace", "3", mode="ignore-term")
    loan_pid = int(wait_for_events(loan_log, "start")[0]["pid"])  # type: ignore[arg-type]
    b, b_log, b_stop = teams.job("b", "b", *B_FLAGS)
    wait_for_events(loan_log, "sigterm")
    loan.proc.send_signal(signal.SIGKILL)
    loan.wait()
    wait_dead(loan_pid)  # the runner's guard ended it
    wait_for_events(b_log, "start", timeout=60)  # the pool reaps the loan after grace (3 s) + margin (5 s)
    held = leases(teams.env)
    assert sorted(str(x["queue"]) for x in held) == ["a", "b"]  # A's job within quota kept its lease
    for stop, runner in ((b_stop, b), (first_stop, first)):
        stop.touch()
        assert runner.wait() == 0, runner.stderr
    assert leases(teams.env) == []


def test_kill_9_of_the_server_while_a_lease_is_being_preempted(teams: Teams, tmp_path: Path) -> None:
    first, first_log, first_stop = teams.job("a1", "a")
    wait_for_events(first_log, "start")
    loan, loan_log, loan_stop = teams.job("a2", "a", "--requeue", "--preempt-grace", "2", mode="ignore-term")
    loan_pid = int(wait_for_events(loan_log, "start")[0]["pid"])  # type: ignore[arg-type]
    b, b_log, b_stop = teams.job("b", "b", "--wait", "600")
    wait_for_events(loan_log, "sigterm")
    held_before = {str(x["id"]) for x in leases(teams.env)}
    teams.server.stop(signal.SIGKILL)
    # The runner's own timer SIGKILLs the command after the grace (2 s), server or not (it would run on).
    wait_dead(loan_pid, timeout=60)
    port = teams.server.url.rsplit(":", 1)[1]
    restarted = start_server(teams.server.state, "--listen", f"127.0.0.1:{port}")
    try:
        assert restarted.url == teams.server.url
        env = dict(teams.env, GPUPOOL_TOKEN=restarted.token or "")
        # A's lease within quota survived the crash; the preempted loan is released or reaped.
        after = {str(x["id"]) for x in leases(env)}
        first_lease = str(events(first_log)[0]["lease"])
        assert first_lease in held_before and first_lease in after
        if b.proc.poll() is not None:  # its claim was cut by the crash: B claims again
            b = Runner(["--queue", "b", "--wait", "600", "--", sys.executable, PREEMPTEE, str(b_log), str(b_stop)], env)
        wait_for_events(b_log, "start", timeout=90)
        b_stop.touch()
        assert b.wait() == 0, b.stderr
        rerun = wait_for_events(loan_log, "start", count=2, timeout=90)[1]
        assert rerun["attempt"] == "2"
        loan_stop.touch()
        first_stop.touch()
        # ignore-term only matters for a SIGTERM: the rerun ends at its stop file.
        assert loan.wait() == 0, loan.stderr
        assert first.wait() == 0, first.stderr
        assert leases(env) == []
        for entry in events(loan_log) + events(first_log) + events(b_log):
            wait_dead(int(entry["pid"]))  # type: ignore[arg-type]
    finally:
        restarted.stop(signal.SIGKILL)
