"""Crash benchmark: kill -9 a busy `gpupool server`, again and again, and check that nothing was lost.

Each round starts a server on the same state dir (auth on, 8 emulated 16 GiB GPUs, TTL 600 s),
lets --clients threads claim (1-2 GPUs at 25 % or 50 %) and release on their own keep-alive
connections for --busy-s seconds, kills the server with SIGKILL mid-traffic, restarts it and
checks, from the restarted server's status and `gpupool doctor`:

- lost: an acknowledged lease (201 received) whose release was never attempted is missing;
- resurrected: a lease whose release was acknowledged (200) is back;
- overcommitted: a GPU with more allocated than its memory;
- unsound: doctor finds a broken invariant or a damaged file.

Then it releases every lease (so each round starts empty) and goes on. The verdict is PASS
when all four counts are 0 over every round. Writes benchmarks/results/crash.json.

    python benchmarks/bench_crash.py [--clients 64] [--rounds 20] [--busy-s 1.5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import httpx
import serverproc  # beside this script

ROOT = Path(__file__).resolve().parent
DEVICES = "emulated:8x16GiB"


@dataclass
class Ledger:
    """What the clients were told, under one lock."""

    acked: Set[str] = field(default_factory=set)
    released: Set[str] = field(default_factory=set)
    unsure: Set[str] = field(default_factory=set)  # a release was sent: gone or not, both are right
    lock: threading.Lock = field(default_factory=threading.Lock)


def start_server(state: Path, token_file: Path, log: Path) -> Tuple[subprocess.Popen, str]:
    """A `gpupool server` on 127.0.0.1:0; (process, URL) once it answers /healthz."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc, url = serverproc.start_server(state, token_file, log, DEVICES, env, ["--ttl", "600"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server did not answer /healthz:\n{log.read_text(errors='replace')}")


def client(url: str, headers: Dict[str, str], seed: int, ledger: Ledger, stop: threading.Event) -> None:
    """Claim and release until the server dies or `stop` is set."""
    rng = random.Random(seed)
    mine: List[str] = []
    with httpx.Client(base_url=url, headers=headers, timeout=5) as http:
        while not stop.is_set():
            try:
                if mine and rng.random() < 0.45:
                    lease_id = mine.pop(rng.randrange(len(mine)))
                    with ledger.lock:
                        ledger.unsure.add(lease_id)
                    if http.delete(f"/v1/leases/{lease_id}").status_code == 200:
                        with ledger.lock:
                            ledger.released.add(lease_id)
                else:
                    request = {"count": rng.choice([1, 2]), "fraction": rng.choice([0.25, 0.5])}
                    r = http.post("/v1/leases", json={"claim": {"requests": [request]}, "holder": {"pid": seed}})
                    if r.status_code == 201:
                        lease_id = r.json()["id"]
                        with ledger.lock:
                            ledger.acked.add(lease_id)
                        mine.append(lease_id)
            except httpx.HTTPError:
                return  # the server died under us


def run_round(
    state: Path, token_file: Path, clients: int, busy_s: float, number: int, min_acked: int = 0
) -> Dict[str, Any]:
    """One round: traffic, kill -9, restart, check, release everything. The kill comes after
    `busy_s` and, where `min_acked` is given, once that many claims were acknowledged (a test's
    condition: a loaded machine makes fewer in the same time)."""
    proc, url = start_server(state, token_file, state.parent / f"server-{number}.log")
    headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    ledger, stop = Ledger(), threading.Event()
    threads = [
        threading.Thread(target=client, args=(url, headers, number * 1000 + i, ledger, stop), daemon=True)
        for i in range(clients)
    ]
    for t in threads:
        t.start()
    time.sleep(busy_s)
    deadline = time.monotonic() + 120
    while len(ledger.acked) < min_acked and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    stop.set()
    for t in threads:
        t.join(10)
    again, url = start_server(state, token_file, state.parent / f"server-{number}-after.log")
    try:
        status = httpx.get(url + "/v1/status", headers=headers, timeout=30).json()
        doctor = httpx.get(url + "/v1/doctor", headers=headers, timeout=60).json()
        live = {lease["id"] for lease in status["leases"]}
        for lease_id in live:
            httpx.delete(f"{url}/v1/leases/{lease_id}", headers=headers, timeout=30)
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(30)
    return {
        "round": number,
        "acknowledged": len(ledger.acked),
        "released": len(ledger.released),
        "live_after_restart": len(live),
        "lost": sorted((ledger.acked - ledger.unsure) - live),
        "resurrected": sorted(ledger.released & live),
        "overcommitted": [d["uuid"] for d in status["devices"] if d["allocated_mib"] > d["memory_mib"]],
        "unsound": [p["message"] for p in doctor["problems"]],
    }


def run(clients: int, rounds: int, busy_s: float, state_root: Path, min_acked: int = 0) -> Dict[str, Any]:
    """Every round, and the verdict over all of them."""
    state = state_root / "state"
    token_file = state_root / "token"
    results = []
    for number in range(rounds):
        result = run_round(state, token_file, clients, busy_s, number, min_acked)
        results.append(result)
        print(
            f"round {number + 1}/{rounds}: {result['acknowledged']} acknowledged, {result['released']} released, "
            f"lost {len(result['lost'])}, resurrected {len(result['resurrected'])}, "
            f"overcommitted {len(result['overcommitted'])}, unsound {len(result['unsound'])}",
            file=sys.stderr,
            flush=True,
        )
    totals = {key: sum(len(r[key]) for r in results) for key in ("lost", "resurrected", "overcommitted", "unsound")}
    return {
        "benchmark": "crash",
        "clients": clients,
        "rounds": rounds,
        "busy_s": busy_s,
        "devices": DEVICES,
        "acknowledged": sum(r["acknowledged"] for r in results),
        **totals,
        "verdict": "PASS" if not any(totals.values()) else "FAIL",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "per_round": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--busy-s", type=float, default=1.5, help="seconds of traffic before each kill -9")
    parser.add_argument("--out", default=str(ROOT / "results" / "crash.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-crash-") as tmp:
        report = run(args.clients, args.rounds, args.busy_s, Path(tmp))
    summary = {k: v for k, v in report.items() if k != "per_round"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if report["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
