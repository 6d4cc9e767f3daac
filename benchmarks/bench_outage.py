"""Outage soak: kill -9 the `gpupool server` under heartbeating runners and waiting claims, keep it
down longer than their TTL, start it again on the same state dir and port, and count what was lost.

Setup: a server (auth on, 2 emulated 16 GiB GPUs), --runners `gpupool run`s at --ttl on GPU 0
(each 1/runners of it) whose command runs until the benchmark ends, and a blocker lease that
holds GPU 1. Each round starts --waiters `gpupool run --wait 600` claims of the whole GPU 1 (they
queue behind the blocker), kills the server with SIGKILL, keeps it down --down-s seconds, starts
it again, releases the blocker and waits for every waiting claim to be granted and run, then
claims the blocker again. Counted over all rounds:

- leases_lost: a runner's lease missing from the restarted server at the end of a round (which
  lasts until every runner's heartbeat has renewed its lease again, or 3 TTLs);
- runners_exit_6: runners that ended with exit 6 (lease lost) instead of 0 at the end;
- waiting claims granted (exit 0) of those started, and the seconds from the restart until all were.

The verdict is PASS when no lease was lost, no runner exited 6 and every waiting claim was granted.
Writes benchmarks/results/outage.json.

    python benchmarks/bench_outage.py [--rounds 20] [--runners 4] [--ttl 10] [--down-s 20] [--waiters 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import httpx
import serverproc  # beside this script

ROOT = Path(__file__).resolve().parent
DEVICES = "emulated:2x16GiB"


class Server:
    """The server under test: started, killed -9 and started again on one state dir and port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.token_file = root / "token"
        self.port = quiet_port()
        self.starts = 0
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.url = ""

    def start(self) -> float:
        """Start it (on the port of the first start); returns the seconds until it answered /healthz."""
        begun = time.monotonic()
        log = self.root / f"server-{self.starts}.log"
        self.starts += 1
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        extra = ["--ttl", "30", "--listen", f"127.0.0.1:{self.port}"]
        self.proc, self.url = serverproc.start_server(self.state, self.token_file, log, DEVICES, env, extra)
        self.port = int(self.url.rsplit(":", 1)[1])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return time.monotonic() - begun
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError(f"server did not answer /healthz:\n{log.read_text(errors='replace')}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    @property
    def headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}

    def leases(self) -> List[Dict[str, Any]]:
        return list(httpx.get(self.url + "/v1/leases", headers=self.headers, timeout=10).json()["leases"])

    def queued(self) -> int:
        return int(httpx.get(self.url + "/v1/status", headers=self.headers, timeout=10).json()["queued"])

    def block(self) -> str:
        """Claim the whole GPU 1 for the blocker; its lease id."""
        body = {
            "claim": {"requests": [{"count": 1, "fraction": 1.0, "filters": ["device.index=1"]}]},
            "holder": {"label": "blocker"},
            "wait_s": 60,
            "ttl_s": 3600,
        }
        r = httpx.post(self.url + "/v1/leases", json=body, headers=self.headers, timeout=90)
        r.raise_for_status()
        return str(r.json()["id"])

    def release(self, lease_id: str) -> None:
        httpx.delete(f"{self.url}/v1/leases/{lease_id}", headers=self.headers, timeout=10).raise_for_status()


def quiet_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999), so nothing that binds port 0 while
    the server is down can take it."""
    while True:
        port = random.randint(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def runner(server: Server, root: Path, name: str, args: List[str], command: List[str]) -> subprocess.Popen[bytes]:
    """A `gpupool run` against the server, its stderr in ROOT/NAME.err."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(GPUPOOL_TOKEN=server.token_file.read_text().strip(), GPUPOOL_STATE=str(root / "no-embedded"))
    env.update(HOME=str(root / "home"), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "gpupool", "run", "-q", "--server", server.url, *args, "--", *command]
    with open(root / f"{name}.err", "wb") as err:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)


def wait_until(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def run_round(
    server: Server, root: Path, number: int, runner_ids: Dict[str, str], args: argparse.Namespace, blocker: str
) -> Tuple[Dict[str, Any], str]:
    """One kill -9 round; (its figures, the blocker's new lease id)."""
    claim = ["-n", "1", "-p", "1.0", "--filter", "device.index=1", "--wait", "600"]
    waiters = [runner(server, root, f"r{number}-w{i}", claim, ["true"]) for i in range(args.waiters)]
    queued = wait_until(lambda: server.queued() >= args.waiters, 60)
    server.kill()
    time.sleep(args.down_s)  # the outage
    restart_s = server.start()
    restarted = time.monotonic()
    renewed = {x["id"]: x["expires_at"] for x in server.leases()}  # what the restart gave each lease
    server.release(blocker)
    codes = []
    for proc in waiters:
        try:
            codes.append(proc.wait(120))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    granted_s = time.monotonic() - restarted

    def beaten() -> bool:
        """Every runner's lease renewed by a heartbeat since the restart, or gone."""
        now = {x["id"]: x["expires_at"] for x in server.leases()}
        return all(now.get(i, math.inf) > renewed.get(i, -math.inf) for i in runner_ids.values())

    # Each round lasts until the runners' heartbeats are back, so they (and not only the restart's
    # renewal) are what keeps their leases through the next outage.
    beats_back = wait_until(beaten, 3 * args.ttl)
    beats_s = time.monotonic() - restarted
    live = {x["id"] for x in server.leases()}
    lost = sorted(name for name, lease_id in runner_ids.items() if lease_id not in live)
    blocker = server.block()
    return (
        {
            "round": number + 1,
            "queued_before_kill": queued,
            "server_restart_s": round(restart_s, 2),
            "waiting_started": len(waiters),
            "waiting_granted": sum(1 for c in codes if c == 0),
            "waiting_codes": codes,
            "all_granted_after_restart_s": round(granted_s, 2),
            "heartbeats_back": beats_back,
            "all_heartbeats_back_after_restart_s": round(beats_s, 2),
            "leases_lost": lost,
        },
        blocker,
    )


def run(args: argparse.Namespace, root: Path) -> Dict[str, Any]:
    server = Server(root)
    server.start()
    stop = root / "stop"
    blocker = server.block()
    share = 1.0 / args.runners
    runners = [
        runner(
            server,
            root,
            f"runner{i}",
            [
                "-n",
                "1",
                "-p",
                f"{share:.4f}",
                "--filter",
                "device.index=0",
                "--ttl",
                f"{args.ttl:g}",
                "--label",
                f"runner{i}",
            ],
            ["sh", "-c", f"while [ ! -e {stop} ]; do sleep 0.2; done"],
        )
        for i in range(args.runners)
    ]
    if not wait_until(lambda: len(server.leases()) == args.runners + 1, 60):
        raise SystemExit(f"the runners did not all get a lease: {server.leases()}")
    runner_ids = {x["holder"]["label"]: x["id"] for x in server.leases() if x["holder"]["label"] != "blocker"}
    results = []
    try:
        for number in range(args.rounds):
            result, blocker = run_round(server, root, number, runner_ids, args, blocker)
            results.append(result)
            print(
                f"round {number + 1}/{args.rounds}: restart {result['server_restart_s']} s, waiting claims "
                f"{result['waiting_granted']}/{result['waiting_started']} granted "
                f"({result['all_granted_after_restart_s']} s after it), heartbeats back after "
                f"{result['all_heartbeats_back_after_restart_s']} s, leases lost {len(result['leases_lost'])}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        stop.touch()
        codes = []
        for proc in runners:
            try:
                codes.append(proc.wait(60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        server.kill()
    lost = sum(len(r["leases_lost"]) for r in results)
    started = sum(r["waiting_started"] for r in results)
    granted = sum(r["waiting_granted"] for r in results)
    exit_6 = sum(1 for c in codes if c == 6)
    return {
        "benchmark": "outage",
        "rounds": args.rounds,
        "runners": args.runners,
        "ttl_s": args.ttl,
        "down_s": args.down_s,
        "waiters_per_round": args.waiters,
        "devices": DEVICES,
        "leases_lost": lost,
        "runners_exit_6": exit_6,
        "runner_codes": codes,
        "waiting_started": started,
        "waiting_granted": granted,
        "max_all_granted_after_restart_s": max((r["all_granted_after_restart_s"] for r in results), default=None),
        "max_all_heartbeats_back_after_restart_s": max(
            (r["all_heartbeats_back_after_restart_s"] for r in results), default=None
        ),
        "verdict": "PASS" if lost == 0 and exit_6 == 0 and granted == started and not any(codes) else "FAIL",
        "machine": {"cpus": os.cpu_count(), "arch": platform.machine(), "python": platform.python_version()},
        "per_round": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runners", type=int, default=4, help="heartbeating runners (K)")
    parser.add_argument("--ttl", type=float, default=10.0, help="the runners' lease TTL")
    parser.add_argument("--down-s", type=float, default=20.0, help="seconds the server stays down each round")
    parser.add_argument("--waiters", type=int, default=2, help="waiting claims queued before each kill")
    parser.add_argument("--out", default=str(ROOT / "results" / "outage.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-outage-") as tmp:
        report = run(args, Path(tmp))
    summary = {k: v for k, v in report.items() if k != "per_round"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if report["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
