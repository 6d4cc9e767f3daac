"""Issue 25, done when: `gpupool queue show` on a pool with three waiting claims in two queues lists
them in the order the pool will grant them, with reasons, and that order is what then happens.

A real server with three emulated GPUs, all held by leases of no queue; three real `gpupool run
--wait` processes wait in queues a and b (quotas 0: no preemption, idle GPUs go to the queue that
holds the least). The GPUs are freed one at a time, and each time exactly the next listed claim
starts its command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import httpx
from gpupool_cli import gpupool
from waiting import wait_until


def shown(env: Dict[str, str], url: str, *queue: str) -> List[dict]:
    done = gpupool("queue", "show", *queue, "--json", "--server", url, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["waiting"]


def test_queue_show_lists_the_order_that_then_happens(server_factory, tmp_path: Path) -> None:
    server = server_factory("--devices", "emulated:3x16GiB")
    env = server.client_env(tmp_path)
    admin = server.headers()
    for name in ("a", "b"):
        assert httpx.put(f"{server.url}/v1/queues/{name}", json={"quota": 0}, headers=admin).status_code == 200
    blockers = server.hold_whole_gpus(3)
    flags = tmp_path / "flags"
    flags.mkdir()
    script = f': > {flags}/"$0".started; while [ ! -e {flags}/stop ]; do sleep 0.05; done'
    runs: Dict[str, subprocess.Popen] = {}
    try:
        for label, queue, priority in (("a1", "a", 0), ("b1", "b", 0), ("a2", "a", 5)):
            runs[label] = subprocess.Popen(
                [sys.executable, "-m", "gpupool", "run", "-q", "--server", server.url, "--wait", "600"]
                + ["-p", "1", "--queue", queue, "--priority", str(priority), "--label", label]
                + ["--", "sh", "-c", script, label],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            count = len(runs)
            wait_until(lambda n=count: len(shown(env, server.url)) == n, 60, f"{label} waiting")

        listed = shown(env, server.url)
        order = [w["label"] for w in listed]
        # b1 is the head of b; a2 (priority 5) the head of a, so before a1; both queues hold nothing,
        # and b's head came first. Once b1 runs, b holds a GPU: a's claims go next, a2 then a1.
        assert order == ["b1", "a2", "a1"], listed
        assert [w["position"] for w in listed] == [1, 2, 3]
        assert all(w["why"] == "no-room" and w["reason"].startswith("no room") for w in listed), listed
        assert [w["label"] for w in shown(env, server.url, "a")] == ["a2", "a1"]
        table = gpupool("queue", "show", "--server", server.url, env=env).stdout.splitlines()
        assert table[0] == f"pool: {server.url}"
        assert table[1].split() == ["#", "ID", "QUEUE", "PRIO", "SHARE", "HOLDER", "WAITING", "WHY"]
        assert [line.split()[0] for line in table[2:]] == ["1", "2", "3"] and "[b1]" in table[2]

        started: List[str] = []
        for step, blocker in enumerate(blockers):
            assert httpx.delete(f"{server.url}/v1/leases/{blocker}", headers=admin).status_code == 200
            wait_until(lambda n=step + 1: len(list(flags.glob("*.started"))) == n, 60, f"a run started at step {step}")
            (new,) = {p.name.split(".")[0] for p in flags.glob("*.started")} - set(started)
            started.append(new)
            assert [w["label"] for w in shown(env, server.url)] == order[step + 1 :]
        assert started == order
    finally:
        (flags / "stop").touch()
        for proc in runs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert all(proc.returncode == 0 for proc in runs.values()), {k: p.stderr.read() for k, p in runs.items()}
