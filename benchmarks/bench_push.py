"""Decision to runner: how soon a lease's runner acts on what the pool decided (issue 37).

One `gpupool run --queue Q -p 1.0 --ttl 60 -- sleep MARK` per round, on emulated GPUs; once the
sleep runs and 0.5-1.5 s more have passed (a random moment for the runner's watch), the pool
decides one of five things and the benchmark times, by /proc at 1 ms, until the runner acts:

- release-owner / release-admin: DELETE of the lease by its owner's / an admin's token; acts =
  the sleep no longer runs (gone or a zombie). Embedded: one release by the local user;
- suspend: the owner suspends the lease; acts = the sleep is stopped (the runner parked it);
- preempt-suspend / preempt-requeue: a claim of queue `b` (under its quota) on the full pool
  preempts the run, which borrows in a queue whose preemption suspends / requeues; acts = the
  sleep stopped / gone.

The decision's moment is the return of the release or suspend call (its transaction committed
before), and the send of the preempting claim (its admission decides within that call, so those
figures include the claim's own admission). The TTL is long (60 s): a heartbeat (every TTL/3)
cannot be what tells the runner; its watch must. The five kinds take turns, round by round.

Two pools, each with its own queues: a `gpupool server` (auth on; the runs hold a named token)
and an embedded pool (a state dir shared by the runs and this process). The target is a median
under 0.1 s. Writes benchmarks/results/push.json and prints each kind's median and p95.

    python benchmarks/bench_push.py [--cycles 6] [--pools server,embedded]
    python benchmarks/before_after.py push --before REV --after HEAD   # both in one run
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import httpx
import serverproc  # beside this script
from results_file import load_average, write_and_show  # beside this script
from runs import lease_of, started_pid  # beside this script

from gpupool.core.errors import GpupoolError
from gpupool.core.model import Claim, Holder
from gpupool.core.queues import QueueSpec
from gpupool.pooling.isolation.proctree import alive
from gpupool.workload.client.base import PoolClient

ROOT = Path(__file__).resolve().parent
DEVICES = "emulated:2x16GiB"
TTL_S = 60.0
# The runner's start (a Python process, its claim, its guard) on a loaded machine: a bound, not a speed.
START_WAIT_S = 60.0
# How long a round waits for the runner to act before it counts as not acted.
ACT_WAIT_S = 30.0
# How long the command runs before the decision, drawn anew each round (seconds, uniform).
SETTLE_S = (0.5, 1.5)
KINDS = ("release-owner", "release-admin", "suspend", "preempt-suspend", "preempt-requeue")
# The queues: the filler holds one GPU under `f`'s quota; a run borrows the other in `as` (its
# preemption suspends) or `ar` (requeues); a claim of `b` under its quota preempts it.
QUEUES = (
    QueueSpec("f", 1),
    QueueSpec("b", 1),
    QueueSpec("as", 0, preempt="suspend"),
    QueueSpec("ar", 0, preempt="requeue"),
)
TARGET_MEDIAN_S = 0.1


def stopped(pid: int) -> bool:
    """`pid` is stopped (SIGSTOP: the runner parked it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"T", b"t")


class Pool:
    """One pool under test: how to start a run on it, and its owner's and admin's clients."""

    def __init__(self, name: str, env: Dict[str, str], where: List[str], owner: PoolClient, admin: PoolClient):
        self.name, self.env, self.where, self.owner, self.admin = name, env, where, owner, admin


def one_round(pool: Pool, kind: str, n: int) -> Dict[str, Any]:
    """Start a run, let the pool decide `kind`, time the decision to the runner's act."""
    mark = f"3000.{os.getpid()}{n:03d}7373"
    queue = "ar" if kind == "preempt-requeue" else "as"
    argv = [sys.executable, "-m", "gpupool", "run", *pool.where, "--queue", queue, "-p", "1.0"]
    # --wait: the lease of the round before may still be going when this run claims
    argv += ["--ttl", f"{TTL_S:g}", "--wait", f"{START_WAIT_S:g}", "--", "sleep", mark]
    runner = subprocess.Popen(argv, env=pool.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    taken: List[str] = []
    claims: List[threading.Thread] = []
    try:
        lease = lease_of(runner)
        pid = started_pid(mark, START_WAIT_S, n)
        time.sleep(random.uniform(*SETTLE_S))
        acted: Callable[[], bool] = lambda: not alive(pid)  # noqa: E731
        if kind in ("suspend", "preempt-suspend"):
            acted = lambda: stopped(pid) or not alive(pid)  # noqa: E731
        decided = decide(pool, kind, lease, taken, claims)
        while not acted() and time.monotonic() - decided < ACT_WAIT_S:
            time.sleep(0.001)
        act_s = time.monotonic() - decided if acted() else None
        return {"round": n, "kind": kind, "act_s": None if act_s is None else round(act_s, 4)}
    finally:
        for thread in claims:  # b's lease, granted once the run let go (parked it), goes with the rest
            thread.join(ACT_WAIT_S)
        if runner.poll() is None:
            runner.kill()  # its guard ends the command with it
        runner.wait(30)
        if runner.stderr is not None:
            runner.stderr.close()
        for lease_id in taken:
            try:
                pool.admin.release(lease_id)
            except GpupoolError:
                pass  # already gone


def decide(pool: Pool, kind: str, lease: str, taken: List[str], claims: List[threading.Thread]) -> float:
    """Make the pool decide `kind` on `lease`; the monotonic moment of the decision. Leases left
    to release after the round go into `taken`, the preempting claim's thread into `claims`."""
    taken.append(lease)
    if kind == "release-owner":
        pool.owner.release(lease)
    elif kind == "release-admin":
        pool.admin.release(lease)
    elif kind == "suspend":
        pool.owner.suspend(lease)
    else:
        sent = time.monotonic()
        thread = threading.Thread(target=preempt, args=(pool, taken), daemon=True)
        thread.start()
        claims.append(thread)
        return sent
    return time.monotonic()


def preempt(pool: Pool, taken: List[str]) -> None:
    """Claim a whole GPU in queue b (under its quota): the borrowing run is preempted for it."""
    got = pool.admin.claim(Claim.single(1, fraction=1.0, queue="b"), Holder("bench-b"), wait_s=ACT_WAIT_S, ttl_s=600)
    taken.append(got.id)


def summary(rounds: List[Dict[str, Any]]) -> Dict[str, Any]:
    times = sorted(r["act_s"] for r in rounds if r["act_s"] is not None)
    p95 = times[max(0, -(-len(times) * 95 // 100) - 1)] if times else None  # nearest rank
    return {
        "rounds": len(rounds),
        "acted": len(times),
        "median_s": round(statistics.median(times), 4) if times else None,
        "p95_s": p95,
        "max_s": times[-1] if times else None,
    }


def bench(pool: Pool, cycles: int, first: int) -> Dict[str, Any]:
    for spec in QUEUES:
        pool.admin.set_queue(spec)
    # Holds the other GPU all along: a claim of b finds the pool full and preempts the run.
    pool.admin.claim(Claim.single(1, fraction=1.0, queue="f"), Holder("bench-filler"), ttl_s=3600)
    kinds = [k for k in KINDS if pool.name == "server" or k != "release-admin"]  # embedded: one local user
    rounds = [one_round(pool, kind, first + c * len(kinds) + i) for c in range(cycles) for i, kind in enumerate(kinds)]
    every = summary(rounds)
    every["kinds"] = {kind: summary([r for r in rounds if r["kind"] == kind]) for kind in kinds}
    every["per_round"] = rounds
    return every


def server_pool(root: Path) -> Tuple[Pool, Callable[[], None]]:
    from gpupool.workload.client.http import HttpPoolClient

    state, token_file, log = root / "server-state", root / "admin-token", root / "server.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    base.update(HOME=str(root / "home"), GPUPOOL_STATE=str(root / "no-embedded"), PYTHONUNBUFFERED="1")
    proc, url = serverproc.start_server(state, token_file, log, DEVICES, base, ["--ttl", f"{TTL_S:g}"])
    admin_token = token_file.read_text().strip()
    made = httpx.post(
        f"{url}/v1/tokens", json={"name": "bench"}, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30
    )
    made.raise_for_status()
    token = made.json()["token"]
    owner, admin = HttpPoolClient(url, token=token), HttpPoolClient(url, token=admin_token)

    def stop() -> None:
        owner.close()
        admin.close()
        proc.kill()
        proc.wait(10)

    return Pool("server", dict(base, GPUPOOL_TOKEN=token), ["--server", url], owner, admin), stop


def embedded_pool(root: Path) -> Tuple[Pool, Callable[[], None]]:
    from gpupool.pooling.devices import emulated_devices
    from gpupool.workload.client.embedded import EmbeddedPoolClient

    state = root / "embedded-state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(HOME=str(root / "home"), GPUPOOL_STATE=str(state), GPUPOOL_DEVICES=DEVICES, PYTHONUNBUFFERED="1")
    # The devices the runs name in $GPUPOOL_DEVICES, on this host: the same pool.
    client = EmbeddedPoolClient(state, devices=emulated_devices(DEVICES, os.uname().nodename))
    return Pool("embedded", env, [], client, client), client.close


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=6, help="rounds of each kind per pool (default 6)")
    parser.add_argument("--pools", default="server,embedded", help="comma-separated: server, embedded")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "push.json")
    args = parser.parse_args()
    makers = {"server": server_pool, "embedded": embedded_pool}
    pools: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-push-") as tmp:
        for n, name in enumerate(args.pools.split(",")):
            pool, stop = makers[name](Path(tmp))
            try:
                pools[name] = bench(pool, args.cycles, 100 * n)
            finally:
                stop()
    result = {
        "benchmark": "push",
        "what": "seconds from the pool's decision (release, suspend, preemption) to the lease's runner acting on it",
        "cycles": args.cycles,
        "ttl_s": TTL_S,
        "devices": DEVICES,
        "target_median_s": TARGET_MEDIAN_S,
        "pools": pools,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "load_average_at_end": load_average(),
    }
    write_and_show(result, args.out)
    for name, figures in pools.items():
        for kind, k in figures["kinds"].items():
            print(
                f"{name} {kind}: median {k['median_s']} s, p95 {k['p95_s']} s ({k['acted']} of {k['rounds']} acted)",
                file=sys.stderr,
            )
        print(f"{name} all: median {figures['median_s']} s, p95 {figures['p95_s']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
