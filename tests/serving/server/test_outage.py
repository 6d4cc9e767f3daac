"""Issue 23 (2, 3): a server's downtime is no holder's fault.

A real `gpupool server` is killed with SIGKILL and started again on the same state dir and port
while real `gpupool run`s heartbeat, wait in its queue, or stop for a preemption.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import httpx
import pytest
from conftest import ServerProcess, start_server
from envs import quiet_port
from waiting import wait_until

FULL = ["-n", "2", "-p", "1.0"]  # the whole pool of two emulated GPUs


class Restartable:
    """A server that can be killed -9 and started again on the same state dir and port."""

    def __init__(self, state: Path, *extra: str) -> None:
        self.extra = extra
        self.port = quiet_port()
        self.server: ServerProcess = start_server(state, *extra, "--listen", f"127.0.0.1:{self.port}")

    @property
    def url(self) -> str:
        return self.server.url

    def kill(self) -> None:
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait(10)

    def start(self) -> None:
        self.server = start_server(self.server.state, *self.extra, "--listen", f"127.0.0.1:{self.port}")
        assert self.server.url.endswith(f":{self.port}")

    def get(self, path: str) -> Dict:
        return httpx.get(self.url + path, headers=self.server.headers(), timeout=10).json()

    def stop(self) -> None:
        self.server.stop(signal.SIGKILL)


class Runner:
    """A `gpupool run` against the server, its stderr in a file."""

    def __init__(self, server: Restartable, tmp_path: Path, name: str, args: List[str], command: List[str]) -> None:
        self.err = tmp_path / f"{name}.err"
        env = server.server.client_env(tmp_path)
        argv = [sys.executable, "-m", "gpupool", "run", "--server", server.url, *args, "--", *command]
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=tmp_path)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def cleanup():
    owned: List[object] = []
    yield owned
    for thing in reversed(owned):
        thing.kill() if isinstance(thing, Runner) else thing.stop()  # type: ignore[attr-defined]


def until_file(path: Path) -> List[str]:
    """A command that runs until `path` exists (the test says when it ends); it first touches
    `path`.started, so a test knows the runner has its lease's answer and runs the command."""
    return ["sh", "-c", f"touch {path}.started; while [ ! -e {path} ]; do sleep 0.05; done"]


def started(path: Path) -> bool:
    return Path(f"{path}.started").exists()


def leases(server: Restartable) -> List[Dict]:
    return server.get("/v1/leases")["leases"]


def running(server: Restartable, tmp_path: Path, until: Path, cleanup: List[object]) -> Tuple[Runner, str]:
    """A runner at --ttl 4 whose command runs until `until` exists, and its lease id, once the command
    runs: the lease is listed before its answer reaches the runner, so a test that kills the server
    waits for the command."""
    runner = Runner(server, tmp_path, "a", ["-n", "1", "-p", "0.5", "--ttl", "4"], until_file(until))
    cleanup.append(runner)
    lease_id = wait_until(lambda: [x["id"] for x in leases(server)], 30, "the runner's lease")[0]
    wait_until(lambda: started(until), 30, "the command to start")
    return runner, lease_id


def test_a_runner_at_ttl_4_survives_6_s_of_downtime(tmp_path, cleanup):
    server = Restartable(tmp_path / "state")
    cleanup.append(server)
    done = tmp_path / "done"
    runner, lease_id = running(server, tmp_path, done, cleanup)
    server.kill()
    time.sleep(6.0)  # the outage itself, longer than the TTL (nothing is asserted after it)
    server.start()
    wait_until(lambda: "works again" in runner.stderr(), 20, "the heartbeat back")
    assert [x["id"] for x in leases(server)] == [lease_id]
    done.touch()
    assert runner.wait() == 0, runner.stderr()
    err = runner.stderr()
    assert "lost" not in err
    assert err.count("heartbeat failed") == 1 and err.count("works again") == 1, err


def test_a_waiting_claim_keeps_its_place_through_a_restart(tmp_path, cleanup):
    server = Restartable(tmp_path / "state", "--ttl", "30")
    cleanup.append(server)
    headers = server.server.headers()
    body = {"claim": {"requests": [{"count": 2, "fraction": 1.0}]}, "holder": {"name": "full"}, "ttl_s": 600}
    full = httpx.post(server.url + "/v1/leases", json=body, headers=headers, timeout=10).json()["id"]
    order = tmp_path / "order"
    first = Runner(server, tmp_path, "b", [*FULL, "--wait", "600"], ["sh", "-c", f"echo b >> {order}"])
    cleanup.append(first)
    wait_until(lambda: server.get("/v1/status")["queued"] == 1, 30, "b in the queue")
    server.kill()
    wait_until(lambda: "trying again until" in first.stderr(), 30, "b to notice")
    server.start()
    later = Runner(server, tmp_path, "c", [*FULL, "--wait", "600"], ["sh", "-c", f"echo c >> {order}"])
    cleanup.append(later)
    wait_until(lambda: server.get("/v1/status")["queued"] == 2, 30, "b back and c queued")
    wait_until(lambda: "answers again" in first.stderr(), 30, "b back")
    assert httpx.delete(f"{server.url}/v1/leases/{full}", headers=headers, timeout=10).status_code == 200
    assert first.wait() == 0, first.stderr()
    assert later.wait() == 0, later.stderr()
    assert order.read_text().split() == ["b", "c"]
    assert first.stderr().count("warning: cannot reach") == 1


@pytest.mark.parametrize("heard", [True, False], ids=["borrower-told", "kill-at-once"])
def test_kill_9_in_the_middle_of_a_preemption_loses_no_lease(tmp_path, cleanup, heard):
    """Killed once the borrower heard of its preemption, or at once (it may hear only after the restart)."""
    server = Restartable(tmp_path / "state", "--ttl", "30", "--preempt-grace", "60")
    cleanup.append(server)
    headers = server.server.headers()
    for name in ("a", "b"):
        r = httpx.put(
            f"{server.url}/v1/queues/{name}", json={"quota": 1, "preempt": "kill"}, headers=headers, timeout=10
        )
        assert r.status_code == 200, r.text
    stop = tmp_path / "stop"
    term = tmp_path / "got-term"
    # The borrower hears SIGTERM and goes on until the test says: the preemption stays half-way.
    borrower_cmd = ["sh", "-c", f"trap 'touch {term}' TERM; while [ ! -e {stop} ]; do sleep 0.05; done"]
    borrower = Runner(server, tmp_path, "borrower", [*FULL, "--queue", "b", "--ttl", "6"], borrower_cmd)
    cleanup.append(borrower)
    victim = wait_until(lambda: leases(server), 30, "the borrower's lease")[0]["id"]
    claimant = Runner(server, tmp_path, "claimant", ["-n", "1", "-p", "1.0", "--queue", "a", "--wait", "600"], ["true"])
    cleanup.append(claimant)

    def preempted() -> Optional[Dict]:
        lease = server.get(f"/v1/leases/{victim}")
        return lease if lease.get("preempted_at") and (term.exists() or not heard) else None

    wait_until(preempted, 30, "the preemption to reach the borrower")
    server.kill()
    time.sleep(8.0)  # the outage: longer than the borrower's TTL
    server.start()
    wait_until(lambda: "answers again" in claimant.stderr(), 30, "the claimant back")
    assert [x["id"] for x in leases(server)] == [victim], "the preempted lease is neither lost nor done yet"
    wait_until(term.exists, 30, "the borrower to hear of it")
    stop.touch()
    assert claimant.wait() == 0, claimant.stderr()
    assert borrower.wait() == 8, borrower.stderr()  # stopped by its preemption (exit 8), not lost (exit 6)
    assert "was lost" not in borrower.stderr()
    assert "Locked 1 GPUs" in claimant.stderr()


def test_a_retried_claim_gets_the_lease_granted_to_it(running_server):
    body = {"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "key": "k" * 32}
    url, headers = running_server.url + "/v1/leases", running_server.headers()
    first = httpx.post(url, json=body, headers=headers, timeout=10).json()
    again = httpx.post(url, json=body, headers=headers, timeout=10).json()
    assert again["id"] == first["id"]
    bad = httpx.post(url, json={**body, "key": "x\n"}, headers=headers, timeout=10)
    assert bad.status_code == 422 and "key" in bad.json()["error"]["message"]


def test_a_lease_released_by_an_admin_after_the_return_still_ends_the_run_with_exit_6(tmp_path, cleanup):
    server = Restartable(tmp_path / "state")
    cleanup.append(server)
    runner, lease_id = running(server, tmp_path, tmp_path / "never", cleanup)
    server.kill()
    wait_until(lambda: "heartbeat failed" in runner.stderr(), 30, "the runner to notice")
    server.start()
    r = httpx.delete(f"{server.url}/v1/leases/{lease_id}", headers=server.server.headers(), timeout=10)
    assert r.status_code == 200, r.text
    assert runner.wait(30) == 6, runner.stderr()
    assert "was released by" in runner.stderr()  # the pool's word on who ended it (issue 34 item 2)
