"""Release benchmark: how soon a released lease's command is gone (issue 34, item 2).

Each round starts `gpupool run -p 0.25 --ttl TTL -- sleep MARK`, waits for the sleep to run and
0.5-1.5 s more (a random moment for the runner's watch), releases the lease and times from the release call's return to the sleep's end (the process gone
or a zombie: it no longer runs). The TTL is long (60 s), so a heartbeat (every TTL/3) cannot be
what ends it: the runner's watch must hear the release. Two pools, --rounds each:

- server: a `gpupool server` (auth on); the run holds a named token, and the release is a
  DELETE /v1/leases/ID by that token (the owner) or by the admin token, in turn;
- embedded: a state dir shared by the run and this process, released through the embedded client.

Each round also checks what the runner said: exit code 6 and a line naming who released it. The
target is a median under 1 s. Writes benchmarks/results/release.json and prints the median and
p95 of each pool.

    python benchmarks/bench_release.py [--rounds 20] [--ttl 60]
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
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import httpx
import serverproc  # beside this script
from results_file import load_average, write_and_show  # beside this script
from runs import lease_of, started_pid  # beside this script

from gpupool.core.errors import LeaseLost
from gpupool.pooling.isolation.proctree import alive

ROOT = Path(__file__).resolve().parent
DEVICES = "emulated:2x16GiB"
# The runner's start (a Python process, its claim, its guard) on a loaded machine: a bound, not a speed.
START_WAIT_S = 60.0
# How long a round waits for the command to go before it counts as not ended.
END_WAIT_S = 30.0
# How long the command runs before its release, drawn anew each round (seconds, uniform).
SETTLE_S = (0.5, 1.5)


def one_round(
    env: Dict[str, str], where: List[str], ttl_s: float, n: int, release: Callable[[str], None]
) -> Dict[str, Any]:
    """Start a run, release its lease, time the release's return to the command's end."""
    mark = f"3000.{os.getpid()}{n:03d}4545"
    argv = [sys.executable, "-m", "gpupool", "run", *where, "-p", "0.25", "--ttl", f"{ttl_s:g}", "--", "sleep", mark]
    runner = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lease = lease_of(runner)
        pid = started_pid(mark, START_WAIT_S, n)
        # Released while the command runs, at a moment the watch does not know: its first long poll
        # goes out START_S after the start, and the pool looks at the lease every WATCH_POLL_S.
        time.sleep(random.uniform(*SETTLE_S))
        release(lease)
        returned = time.monotonic()
        while alive(pid) and time.monotonic() - returned < END_WAIT_S:
            time.sleep(0.001)
        gone_s = time.monotonic() - returned if not alive(pid) else None
        _, err = runner.communicate(timeout=END_WAIT_S)
        said = next((line for line in err.splitlines() if "ending the command" in line), "")
        return {
            "round": n,
            "gone_s": None if gone_s is None else round(gone_s, 4),
            "exit_code": runner.returncode,
            "said_who": "released by its owner" in said or "released by an admin" in said,
            "line": said,
        }
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)


def summary(rounds: List[Dict[str, Any]]) -> Dict[str, Any]:
    times = sorted(r["gone_s"] for r in rounds if r["gone_s"] is not None)
    p95 = times[max(0, -(-len(times) * 95 // 100) - 1)] if times else None  # nearest rank
    return {
        "rounds": len(rounds),
        "ended": len(times),
        "median_s": round(statistics.median(times), 4) if times else None,
        "p95_s": p95,
        "max_s": times[-1] if times else None,
        "exit_6": sum(r["exit_code"] == LeaseLost.exit_code for r in rounds),
        "named_who": sum(r["said_who"] for r in rounds),
        "per_round": rounds,
    }


def bench_server(root: Path, rounds: int, ttl_s: float) -> Dict[str, Any]:
    state, token_file, log = root / "server-state", root / "admin-token", root / "server.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    base.update(HOME=str(root / "home"), GPUPOOL_STATE=str(root / "no-embedded"), PYTHONUNBUFFERED="1")
    proc, url = serverproc.start_server(state, token_file, log, DEVICES, base, ["--ttl", "60"])
    try:
        admin = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        made = httpx.post(f"{url}/v1/tokens", json={"name": "bench"}, headers=admin, timeout=30)
        made.raise_for_status()
        owner = {"Authorization": f"Bearer {made.json()['token']}"}
        env = dict(base, GPUPOOL_TOKEN=made.json()["token"])
        with httpx.Client(timeout=30) as http:
            results = []
            for n in range(rounds):
                headers = owner if n % 2 == 0 else admin

                def release(lease: str, headers: Dict[str, str] = headers) -> None:
                    http.delete(f"{url}/v1/leases/{lease}", headers=headers).raise_for_status()

                results.append(one_round(env, ["--server", url], ttl_s, n, release))
        return summary(results)
    finally:
        proc.kill()
        proc.wait(10)


def bench_embedded(root: Path, rounds: int, ttl_s: float) -> Dict[str, Any]:
    from gpupool.pooling.devices import emulated_devices
    from gpupool.workload.client.embedded import EmbeddedPoolClient

    state = root / "embedded-state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(HOME=str(root / "home"), GPUPOOL_STATE=str(state), GPUPOOL_DEVICES=DEVICES, PYTHONUNBUFFERED="1")
    # The devices the runs name in $GPUPOOL_DEVICES, on this host: the same pool.
    client = EmbeddedPoolClient(state, devices=emulated_devices(DEVICES, os.uname().nodename))
    try:
        return summary([one_round(env, [], ttl_s, 100 + n, client.release) for n in range(rounds)])
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="releases per pool (default 20)")
    parser.add_argument("--ttl", type=float, default=60.0, help="the runs' lease TTL in seconds (default 60)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "release.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-release-") as tmp:
        root = Path(tmp)
        pools = {
            "server": bench_server(root, args.rounds, args.ttl),
            "embedded": bench_embedded(root, args.rounds, args.ttl),
        }
    result = {
        "benchmark": "release",
        "what": "seconds from the release call's return to the released lease's command no longer running",
        "rounds": args.rounds,
        "ttl_s": args.ttl,
        "devices": DEVICES,
        "target_median_s": 1.0,
        "pools": pools,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "load_average_at_end": load_average(),
    }
    write_and_show(result, args.out)
    for name, figures in pools.items():
        print(
            f"{name}: median {figures['median_s']} s, p95 {figures['p95_s']} s over {figures['ended']} of "
            f"{figures['rounds']} releases; exit 6 in {figures['exit_6']}, who named in {figures['named_who']}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
