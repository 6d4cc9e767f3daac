"""Fail-closed starts on CPU with emulated GPUs (issue 38): a start that cannot be capped must not run.

Many `gpupool run` starts (--starts, 1,000 by default; --parallel at a time) of a job that tries to
allocate twice its share, against a real `gpupool server` in `mps` isolation on 2 emulated 16 GiB
GPUs, its MPS control daemon being the stand-in of benchmarks/mps_stand_in.py (the driver's binary
is not on a CPU machine). The starts come in blocks of --block, each under one disturbance in turn:

- steady: nothing disturbed;
- server-restart: the server is killed with kill -9 once a third of the block's starts were
  launched and one of its jobs runs (its lease held through the outage), and started again on the same port (the same state dir) OUTAGE_S later; half the
  block's starts may queue (--wait 60: they ride the outage out), half may not (--wait 0);
- attest-busy: five other uids (60001-60005, root needed) each hold 6 silent connections to the
  node's attestation socket, and open another whenever one is closed (issue 34's starvers);
- mps-down: the server's MPS control daemon is killed with kill -9 before the block and the one
  the server starts again does not listen until the block is over (the stand-in's FAKE_MPS_HOLD:
  a daemon slow to come up); half the block's starts have GPUPOOL_MPS_WAIT=0, half 1.

The job stands for a CUDA program that allocates through the driver (not a framework's allocator):
as the CUDA driver does, it is held to CUDA_MPS_PINNED_DEVICE_MEM_LIMIT only if an MPS control
daemon answers on its CUDA_MPS_PIPE_DIRECTORY when it starts, and otherwise runs without MPS,
silently; outside `mps` isolation its cap is the allocator limit of the hooks
(GPUPOOL_ALLOCATOR_LIMIT_MIB). It "allocates" by writing its row of the emulated usage file (the
watchdog's NVML) and records what it used. Counted, per start:

- over_cap: the job ran and used more than its share (goal 0);
- refused: the command never started; the reason is the run's one `gpupool: error:` line and
  its exit code;
- stopped: the command started and was ended (watchdog, lost lease), with the run's last line;
- outlived: the job still ran after its run had exited (goal 0); and after the last start, the
  leases still held once their TTL has passed (goal 0).

Writes benchmarks/results/fail-closed-cpu.json.

    python benchmarks/bench_fail_closed.py [--starts 1000] [--block 10] [--parallel 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import httpx
import serverproc  # beside this script
from results_file import load_average, write_and_show

from gpupool.pooling.isolation import mps
from gpupool.pooling.isolation.emulated_usage import EMULATED_USAGE_ENV
from gpupool.pooling.isolation.env import MPS_WAIT_ENV
from gpupool.pooling.isolation.proctree import alive
from gpupool.serving.enforcement.attest import socket_path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "fail-closed-cpu.json"
DEVICES = "emulated:2x16GiB"
SHARE_MIB = 4096  # each start's share (-m); the job wants twice that
WANT_MIB = 2 * SHARE_MIB
HOLD_S = 0.3  # how long the job holds its memory: restarts and kills land while jobs run
RUN_TTL_S = 20.0  # the runs' lease TTL: a server restart must come back within it
OUTAGE_S = 2.0  # how long a killed server stays down before it is started again
KINDS = ("steady", "server-restart", "attest-busy", "mps-down")
STARVERS = range(60001, 60006)  # five other users
HELD = 6  # silent connections each starver keeps open
WAIT_S = 120.0  # the limit of every wait for a condition (a loaded machine is slow, never wrong)
ERROR_PREFIX = "gpupool: error:"

# The job: argv RECORD WANT_MIB HOLD_S. Its cap as the driver would hold it (see the docstring).
JOB = r"""
import fcntl, json, os, socket, sys, time
record, want, hold_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
env = os.environ
cap, by = None, "none"
limit = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
if limit:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(os.path.join(env.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps", "control"))
        cap, by = int(limit.split(",")[0].split("=")[1].rstrip("M")), "mps"
    except OSError:
        pass  # no daemon: CUDA runs the program without MPS, with no limit
    finally:
        sock.close()
elif env.get("GPUPOOL_ALLOCATOR_LIMIT_MIB"):
    cap, by = int(env["GPUPOOL_ALLOCATOR_LIMIT_MIB"].split(",")[0]), "hooks"
used = want if cap is None else min(want, cap)
uuid, usage = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0], env.get("GPUPOOL_EMULATED_USAGE", "")

def update(mib):
    if not (usage and uuid):
        return
    with open(usage + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(usage) as f:
                rows = json.load(f)
        except (OSError, ValueError):
            rows = {}
        gpu = rows.setdefault(uuid, {})
        if mib:
            gpu[str(os.getpid())] = mib
        else:
            gpu.pop(str(os.getpid()), None)
        with open(usage + ".tmp", "w") as f:
            json.dump(rows, f)
        os.replace(usage + ".tmp", usage)

update(used)
with open(record + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "cap_by": by, "cap_mib": cap, "used_mib": used, "lease": env.get("GPUPOOL_LEASE_ID")}, f)
os.replace(record + ".tmp", record)
time.sleep(hold_s)
update(0)
"""

# A local user that holds the attestation socket busy.
STARVER = Path(__file__).resolve().parent / "attest_starver.py"


def wait_for(condition: Callable[[], Any], what: str, limit_s: float = WAIT_S) -> Any:
    """Poll `condition` until it is true; SystemExit naming `what` after `limit_s`."""
    deadline = time.monotonic() + limit_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {limit_s:g} s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Pool:
    """The server under test, its state in a folder other uids can reach, the stand-in MPS binary."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.chmod(0o755)  # the starvers (other uids) reach the attestation socket through it
        self.state = root / "state"
        self.token_file = root / "token"
        self.usage = root / "usage.json"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        self.binary = bin_dir / mps.MPS_CONTROL
        self.binary.write_text(f"#!{sys.executable}\n" + (HERE / "mps_stand_in.py").read_text())
        self.binary.chmod(self.binary.stat().st_mode | stat.S_IXUSR)
        base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        self.env = dict(base, PATH=f"{bin_dir}{os.pathsep}{base.get('PATH', '')}", PYTHONUNBUFFERED="1")
        self.env[EMULATED_USAGE_ENV] = str(self.usage)
        self.mps_hold = root / "mps-hold"  # while it exists, a daemon the server starts does not listen
        self.env["FAKE_MPS_HOLD"] = str(self.mps_hold)
        self.port = free_port()
        self.url = ""
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.restarts = 0
        self.starver_blocks = 0  # attest-busy blocks run under the starvers (root only)
        self.pipe_dir, self.log_dir = mps.mps_dirs(self.state)

    def start(self) -> None:
        log = self.root / f"server-{self.restarts}.log"
        extra = ["--listen", f"127.0.0.1:{self.port}", "--isolation", "mps", "--usage-interval", "0.5"]
        self.proc, self.url = serverproc.start_server(self.state, self.token_file, log, DEVICES, self.env, extra)
        wait_for(self.healthy, "the server's /healthz")

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.restarts += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        daemon = self.daemon_pid()
        if daemon is not None and alive(daemon):  # a daemon left by a killed server, never adopted
            os.killpg(daemon, signal.SIGKILL)

    def leases(self) -> List[dict]:
        headers = {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}
        return list(httpx.get(self.url + "/v1/status", headers=headers, timeout=10).json()["leases"])

    def daemon_pid(self) -> Optional[int]:
        try:
            return int((self.pipe_dir.parent / mps.PID_FILE).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def mps_answers(self) -> bool:
        return mps.answers(self.pipe_dir, self.log_dir, str(self.binary), timeout_s=5.0)

    def run_env(self) -> Dict[str, str]:
        return dict(
            self.env,
            GPUPOOL_TOKEN=self.token_file.read_text().strip(),
            GPUPOOL_STATE=str(self.root / "no-embedded"),
            HOME=str(self.root / "home"),
        )


def classify(n: int, kind: str, done: subprocess.CompletedProcess[str], record: Path, share_mib: int) -> Dict[str, Any]:
    """One start's outcome from its exit code, its stderr and the job's record (if it ran)."""
    job = json.loads(record.read_text()) if record.exists() else None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
    outcome: Dict[str, Any] = {"n": n, "kind": kind, "exit": done.returncode, "started": job is not None}
    if job is not None:
        outcome.update(cap_by=job["cap_by"], used_mib=job["used_mib"], over_cap=job["used_mib"] > share_mib)
        outcome["outlived"] = alive(int(job["pid"]))  # right after its run exited
    else:
        outcome.update(over_cap=False, outlived=False)
    # The command ended but its release found no server (an outage): the lease expires after its TTL.
    outcome["release_lost"] = any("could not release lease" in line for line in lines)
    if done.returncode != 0:
        outcome["errors"] = len(errors)
        outcome["reason"] = (errors or lines or ["(nothing said)"])[-1]
    return outcome


def start_once(
    pool: Pool, n: int, kind: str, work: Path, extra_env: Dict[str, str], wait_s: float = 60.0
) -> Dict[str, Any]:
    record = work / f"job-{n}.json"
    command = [sys.executable, "-m", "gpupool.cli.workload", "run", "--server", pool.url, "-q"]
    command += ["-m", str(SHARE_MIB), "--wait", f"{wait_s:g}", "--ttl", f"{RUN_TTL_S:g}"]
    command += ["--", sys.executable, "-c", JOB, str(record), str(WANT_MIB), str(HOLD_S)]
    env = dict(pool.run_env(), **extra_env)
    began = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    outcome = classify(n, kind, done, record, SHARE_MIB)
    outcome["seconds"] = round(time.monotonic() - began, 2)
    if os.environ.get("BENCH_FAIL_CLOSED_TRACE"):
        outcome["stderr"] = done.stderr[-2000:]
    return outcome


def start_starvers(pool: Pool) -> List[subprocess.Popen[bytes]]:
    """One starver per uid of STARVERS; returns once each holds its HELD connections."""
    path = str(socket_path(pool.state))
    ready = pool.root / f"ready-{time.monotonic_ns()}"
    ready.mkdir()
    ready.chmod(0o777)
    procs = [
        subprocess.Popen(
            [sys.executable, "-I", str(STARVER), str(uid), path, str(HELD), str(ready / str(uid)), "900"],
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for uid in STARVERS
    ]
    try:
        wait_for(lambda: all((ready / str(uid)).exists() for uid in STARVERS), "every starver to hold its connections")
    except BaseException:
        stop_all(procs)
        raise
    pool.starver_blocks += 1
    return procs


def stop_all(procs: List[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def run_block(pool: Pool, kind: str, numbers: List[int], work: Path, parallel: int) -> List[Dict[str, Any]]:
    """The block's starts, `parallel` at a time, under the disturbance `kind`."""
    starvers: List[subprocess.Popen[bytes]] = []
    launched = [0]
    lock = threading.Lock()
    disturber: Optional[threading.Thread] = None
    if kind == "attest-busy" and os.geteuid() == 0:
        starvers = start_starvers(pool)
    elif kind == "mps-down":
        pool.mps_hold.touch()
        pid = pool.daemon_pid()
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pool.mps_answers(), "the MPS daemon to stop answering")
    elif kind == "server-restart":

        def disturb() -> None:
            wait_for(
                lambda: launched[0] >= len(numbers) // 3 and any((work / f"job-{n}.json").exists() for n in numbers),
                "a third of the block launched and one of its jobs running",
            )
            pool.kill()
            time.sleep(OUTAGE_S)
            pool.start()

        disturber = threading.Thread(target=disturb, daemon=True)
        disturber.start()

    def one(n: int) -> Dict[str, Any]:
        with lock:
            launched[0] += 1
        if kind == "mps-down":  # half fail at once, half after asking again for a second
            return start_once(pool, n, kind, work, {MPS_WAIT_ENV: str(n % 2)})
        if kind == "server-restart":  # half queue through the outage, half do not wait
            return start_once(pool, n, kind, work, {}, wait_s=60.0 * (n % 2))
        return start_once(pool, n, kind, work, {})

    try:
        with ThreadPoolExecutor(max_workers=parallel) as executor:
            outcomes = list(executor.map(one, numbers))
    finally:
        stop_all(starvers)
        if disturber is not None:
            disturber.join(WAIT_S)
    if kind == "mps-down":  # the next block starts with the daemon back
        pool.mps_hold.unlink()
        wait_for(pool.mps_answers, "the server's MPS daemon to answer again")
    return outcomes


def summarize(outcomes: List[Dict[str, Any]], leases_left: int, seconds: float, pool: Pool) -> Dict[str, Any]:
    refused = [o for o in outcomes if not o["started"]]
    stopped = [o for o in outcomes if o["started"] and o["exit"] != 0]
    by_exit: Dict[str, Dict[str, Any]] = {}
    for o in refused + stopped:
        entry = by_exit.setdefault(str(o["exit"]), {"count": 0, "by_kind": {}, "example": o["reason"]})
        entry["count"] += 1
        entry["by_kind"][o["kind"]] = entry["by_kind"].get(o["kind"], 0) + 1
    per_kind = {
        kind: {
            "starts": sum(o["kind"] == kind for o in outcomes),
            "ran": sum(o["kind"] == kind and o["started"] for o in outcomes),
            "refused": sum(o["kind"] == kind and not o["started"] for o in outcomes),
        }
        for kind in KINDS
    }
    return {
        "benchmark": "fail-closed starts (issue 38), CPU, emulated GPUs",
        "setup": {
            "devices": DEVICES,
            "isolation": "mps (stand-in control daemon, benchmarks/mps_stand_in.py)",
            "share_mib": SHARE_MIB,
            "job_wants_mib": WANT_MIB,
            "job_holds_s": HOLD_S,
            "kinds": list(KINDS),
        },
        "starts": len(outcomes),
        "over_cap": sum(o["over_cap"] for o in outcomes),
        "ran_capped": sum(o["started"] and not o["over_cap"] for o in outcomes),
        "refused": len(refused),
        "stopped": len(stopped),
        "refused_without_one_line_reason": sum(o.get("errors") != 1 for o in refused),
        "outlived_their_run": sum(o["outlived"] for o in outcomes),
        "releases_lost_to_an_outage": sum(o["release_lost"] for o in outcomes),
        "leases_left_after_ttl": leases_left,
        "server_kills": pool.restarts,
        "blocks_under_attestation_starvers": pool.starver_blocks,
        "reasons_by_exit_code": by_exit,
        "per_kind": per_kind,
        "over_cap_starts": [o for o in outcomes if o["over_cap"]][:20],
        "seconds": round(seconds, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_at_end": load_average(),
        },
    }


def run(starts: int, block: int = 10, parallel: int = 4, state_root: Optional[Path] = None) -> Dict[str, Any]:
    """Run `starts` starts in blocks of `block`, the disturbances in turn; the summary."""
    # Under /tmp by default: the starvers (other uids) must reach the attestation socket through every
    # folder above it, which pytest's tmp_path (0700) does not let them.
    root = Path(tempfile.mkdtemp(prefix="gpupool-fail-closed-", dir=str(state_root) if state_root else "/tmp"))
    pool = Pool(root)
    work = root / "jobs"
    work.mkdir()
    outcomes: List[Dict[str, Any]] = []
    started = time.monotonic()
    try:
        pool.start()
        numbers = list(range(starts))
        for b, first in enumerate(range(0, starts, block)):
            kind = KINDS[b % len(KINDS)]
            began = time.monotonic()
            outcomes += run_block(pool, kind, numbers[first : first + block], work, parallel)
            took = time.monotonic() - began
            print(f"block {b} ({kind}): {len(outcomes)}/{starts} starts, {took:.1f} s", file=sys.stderr, flush=True)
        deadline = time.monotonic() + RUN_TTL_S + 30  # a release the outage lost: its lease expires
        while pool.leases() and time.monotonic() < deadline:
            time.sleep(0.5)
        leases_left = len(pool.leases())
    finally:
        pool.stop()
        shutil.rmtree(root, ignore_errors=True)
    return summarize(outcomes, leases_left, time.monotonic() - started, pool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--starts", type=int, default=1000, help="how many starts (default 1000)")
    parser.add_argument("--block", type=int, default=10, help="starts per disturbance block (default 10)")
    parser.add_argument("--parallel", type=int, default=4, help="starts at a time (default 4)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the results file (default {OUT})")
    args = parser.parse_args()
    if args.starts < 1 or args.block < 1 or args.parallel < 1:
        parser.error("--starts, --block and --parallel must be at least 1")
    write_and_show(run(args.starts, args.block, args.parallel), args.out)


if __name__ == "__main__":
    main()
