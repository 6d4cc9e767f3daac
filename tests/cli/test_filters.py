"""Issue 36 item 3: `--user`, `--queue` and `--states` on `status`, `queue show` and `usage` (as
`squeue -u/-p/-t`, `sacct -u/-s`), through the real CLI against a server with two tenants."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import httpx
from tenants import gpupool_as
from waiting import wait_until

from gpupool.core.errors import InvalidInput


def test_filters_of_status_queue_show_and_usage(running_server, tmp_path: Path) -> None:
    server = running_server
    env = server.client_env(tmp_path)
    admin = server.headers()
    url = ["--server", server.url]
    tokens = server.make_tokens("alice", "bob")
    made = gpupool_as(env, server.token or "", "queue", "set", "team-a", "--quota", "1", *url)
    assert made.returncode == 0, made.stderr

    def run(who: str, *argv: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "gpupool", "run", "-q", *url, *argv, "--", "sleep", "600"],
            env=dict(env, GPUPOOL_TOKEN=tokens[who]),
            stderr=subprocess.DEVNULL,
        )

    def status(*argv: str) -> dict:
        done = gpupool_as(env, tokens["alice"], "status", "--json", *url, *argv)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def show(*argv: str) -> List[dict]:
        done = gpupool_as(env, tokens["alice"], "queue", "show", "--json", *url, *argv)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["waiting"]

    runs = []
    try:
        runs.append(run("alice", "-p", "1", "--queue", "team-a"))
        runs.append(run("bob", "-p", "1"))
        wait_until(lambda: len(status()["leases"]) == 2, 60, "both leases")
        runs.append(run("alice", "-p", "1", "--wait", "600"))
        wait_until(lambda: len(show()) == 1, 60, "alice's claim waiting")

        assert [lease["holder"]["name"] for lease in status("-u", "alice")["leases"]] == ["alice"]
        assert [w["holder"] for w in status("--user", "alice")["waiting"]] == ["alice"]
        assert [lease["holder"]["name"] for lease in status("--queue", "team-a")["leases"]] == ["alice"]
        only_waiting = status("--states", "waiting")
        assert only_waiting["leases"] == [] and len(only_waiting["waiting"]) == 1
        assert len(status("--states", "running,held")["leases"]) == 2
        assert status("-u", "bob", "--states", "waiting")["waiting"] == []
        table = gpupool_as(env, tokens["alice"], "status", *url, "-u", "bob")
        assert table.returncode == 0 and " bob" in table.stdout and "alice" not in table.stdout, table.stdout

        assert [w["holder"] for w in show("-u", "alice")] == ["alice"]
        assert show("-u", "bob") == [] and show("--states", "held") == []

        bad = gpupool_as(env, tokens["alice"], "status", *url, "--states", "runing")
        assert bad.returncode == InvalidInput.exit_code and "'runing'" in bad.stderr and "running" in bad.stderr
        assert bad.stderr.count("\n") == 1

        runs[1].kill()  # bob's run: its lease expires (the runner said nothing)
        bob_lease = [lease["id"] for lease in status("-u", "bob")["leases"]]
        assert httpx.delete(f"{server.url}/v1/leases/{bob_lease[0]}", headers=admin).status_code == 200

        def usage(*argv: str) -> dict:
            done = gpupool_as(env, tokens["alice"], "usage", "--json", *url, *argv)
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        assert {r["key"] for r in usage("--by", "holder")["usage"]} == {"alice", "bob"}
        assert [r["key"] for r in usage("--by", "holder", "-u", "alice")["usage"]] == ["alice"]
        assert [r["key"] for r in usage("--by", "holder", "--queue", "team-a")["usage"]] == ["alice"]
        ended = usage("--by", "lease", "--states", "released")["leases"]
        assert [r["holder"] for r in ended] == ["bob"]
        assert usage("--by", "lease", "-u", "alice")["leases"] == []
        wrong = gpupool_as(env, tokens["alice"], "usage", *url, "--states", "released")
        assert wrong.returncode == InvalidInput.exit_code and "--by lease" in wrong.stderr
    finally:
        for proc in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
