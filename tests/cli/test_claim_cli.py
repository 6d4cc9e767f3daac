"""Issue 25: `gpupool claim hold|release|priority CLAIM_ID`, as `scontrol hold/release/update
Priority=` do, on a real server with two tenants and real waiting `gpupool run`s: a held claim is
passed over by grants and gets its place back when released, a priority reorders, a stranger gets
403 (CLI exit 10), an unknown id one line naming it (404, CLI exit 4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import httpx
from tenants import gpupool_as
from waiting import wait_until

from gpupool.core.errors import Forbidden, InvalidInput, NotFound


def test_hold_release_priority_through_a_server(running_server, tmp_path: Path) -> None:
    server = running_server
    env = server.client_env(tmp_path)
    admin = server.headers()
    tokens = server.make_tokens("alice", "bob")
    blockers = server.hold_whole_gpus(2)
    flags = tmp_path / "flags"
    flags.mkdir()
    script = f': > {flags}/"$0".started; while [ ! -e {flags}/stop ]; do sleep 0.05; done'
    url = ["--server", server.url]

    def show() -> List[dict]:
        done = gpupool_as(env, tokens["alice"], "queue", "show", "--json", *url)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["waiting"]

    def start(label: str) -> subprocess.Popen:
        count = len(show()) + 1
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "run", "-q", *url, "--wait", "120", "-p", "1", "--label", label]
            + ["--", "sh", "-c", script, label],
            env=dict(env, GPUPOOL_TOKEN=tokens["alice"]),
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: len(show()) == count, 30, f"{label} waiting")
        return proc

    def started() -> List[str]:
        return sorted(p.name.split(".")[0] for p in flags.glob("*.started"))

    runs = []
    try:
        runs += [start("w1"), start("w2")]
        ids = {w["label"]: str(w["ticket"]) for w in show()}

        stranger = gpupool_as(env, tokens["bob"], "claim", "hold", ids["w1"], *url)
        assert stranger.returncode == Forbidden.exit_code, stranger.stderr
        assert stranger.stderr.count("\n") == 1 and "'alice', not 'bob'" in stranger.stderr
        denied = httpx.put(
            f"{server.url}/v1/claims/{ids['w1']}/priority", json={"priority": 3}, headers=server.headers(tokens["bob"])
        )
        assert denied.status_code == 403 and "alice" in denied.json()["error"]["message"]

        held = gpupool_as(env, tokens["alice"], "claim", "hold", ids["w1"], *url)
        assert held.returncode == 0, held.stderr
        assert held.stderr.splitlines()[0] == f"pool: {server.url}" and "held" in held.stderr
        assert [(w["label"], w["position"], w["why"]) for w in show()] == [("w2", 1, "no-room"), ("w1", 0, "held")]

        assert httpx.delete(f"{server.url}/v1/leases/{blockers[0]}", headers=admin).status_code == 200
        wait_until(lambda: started() == ["w2"], 30, "w2 granted past the held w1")
        assert [w["label"] for w in show()] == ["w1"]

        released = gpupool_as(env, tokens["alice"], "claim", "release", ids["w1"], *url)
        assert released.returncode == 0, released.stderr
        runs.append(start("w3"))
        assert [(w["label"], w["position"]) for w in show()] == [("w1", 1), ("w3", 2)]  # its place back
        w3 = next(w["ticket"] for w in show() if w["label"] == "w3")
        raised = gpupool_as(env, server.token or "", "claim", "priority", str(w3), "10", *url)  # an admin may
        assert raised.returncode == 0, raised.stderr
        assert [(w["label"], w["priority"]) for w in show()] == [("w3", 10), ("w1", 0)]

        assert httpx.delete(f"{server.url}/v1/leases/{blockers[1]}", headers=admin).status_code == 200
        wait_until(lambda: started() == ["w2", "w3"], 30, "w3 granted first after its priority rose")
        assert [w["label"] for w in show()] == ["w1"]

        for argv in (["hold", "99999"], ["release", "no-such"], ["priority", "99999", "1"]):
            unknown = gpupool_as(env, tokens["alice"], "claim", *argv, *url)
            assert unknown.returncode == NotFound.exit_code, unknown.stderr
            assert unknown.stderr.count("\n") == 1 and repr(argv[1]) in unknown.stderr
        missing = httpx.post(f"{server.url}/v1/claims/99999/hold", json={}, headers=admin)
        assert missing.status_code == 404 and "'99999'" in missing.json()["error"]["message"]
        bad = gpupool_as(env, tokens["alice"], "claim", "priority", ids["w1"], "high", *url)
        assert bad.returncode == InvalidInput.exit_code and "'high'" in bad.stderr
        for body in ({"priority": "1"}, {"priority": 10**9}, {"priority": 1, "extra": 1}, {}):
            refused = httpx.put(f"{server.url}/v1/claims/{ids['w1']}/priority", json=body, headers=admin)
            assert refused.status_code == 400, (body, refused.text)
    finally:
        (flags / "stop").touch()
        for proc in runs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in runs] == [0, 0, 0]
