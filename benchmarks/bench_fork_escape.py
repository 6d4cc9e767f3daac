"""Fork-escape benchmark (issue 34, item 3): does a daemon that re-forks from its first
millisecond outlive its lease, and how soon is it gone?

Each run is `gpupool run -- sh -c 'env -i python hopper.py STAMP ...; ...'` on an embedded pool:
the hopper (tests/workload/runner/hopper.py) daemonises at once and forks a successor every 0.5 ms, each
process exiting after its fork, rewriting STAMP as it goes. Two ways for the lease to end, --runs
times each:

- kill9: the command goes on (a sleep) once the hopper hops; the runner gets SIGKILL, and its
  guard must end the lease's processes. The clock starts at the kill.
- normal_exit: the command exits once the hopper hops; the runner ends the tree, releases and
  exits. The clock starts at the command's last line (its `date`, written just before it exits).

A run is caught when the hopper's stamp (rewritten every 10 ms while it lives) stops changing for
STILL_S within --window-s and no hopper process is found then; gone_s is the time from the
clock's start to its last stamp (its last sign of life: it died within a stamp period of it). A
look at /proc alone cannot tell: no pid of the hopper lives long enough to be listed and read.
A hopper that escaped is stopped by its stop file after the window. --before REV runs the same against REV's src/ (git archive) first,
for the figures before the fix; --v1 runs the code now once more in the cgroup v1 freezer
(`after_v1`). Writes benchmarks/results/fork-escape.json.

    python benchmarks/bench_fork_escape.py [--runs 20] [--before 8555a61~1] [--v1]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from results_file import load_average, write_and_show  # beside this script

ROOT = Path(__file__).resolve().parents[1]
HOPPER = ROOT / "tests" / "workload" / "runner" / "hopper.py"
OUT = ROOT / "benchmarks" / "results" / "fork-escape.json"
# The hopper's own end: long past any window, so only the lease's end can stop it in time.
LIFETIME_S = 60
# After "gone", the stamp must stay as it is this long.
STILL_S = 0.5
_LOOK_S = 0.005
WAYS = ("kill9", "normal_exit")


def hoppers(stamp: Path) -> List[int]:
    """The hopper's live processes: argv[0] is the interpreter and its command line names `stamp`."""
    found = []
    needle, program = str(stamp).encode(), sys.executable.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        if needle in data and data.split(b"\0")[0] == program:
            found.append(int(name))
    return found


def command(stamp: Path, ended: Path, hold: bool) -> List[str]:
    """The hopper first; then wait until it has stamped (it hops by then); then hold (a sleep) or
    write the wall-clock time and exit."""
    q = shlex.quote
    hop = f"env -i {q(sys.executable)} {q(str(HOPPER))} {q(str(stamp))} {LIFETIME_S}"
    started = f"while [ ! -s {q(str(stamp))} ]; do sleep 0.01; done"
    tail = "exec sleep 600" if hold else f"date +%s.%N > {q(str(ended))}"
    return ["sh", "-c", f"{hop}; {started}; {tail}"]


def watch(stamp: Path, start: float, window_s: float) -> Dict[str, Any]:
    """Watch the hopper's stamp until it has not changed for STILL_S, or `window_s` passed."""
    last, since = stamp.read_bytes(), time.monotonic()
    begun = time.monotonic()
    while time.monotonic() - since < STILL_S:
        if time.monotonic() - begun > window_s:
            return {"caught": False, "gone_s": None}
        time.sleep(_LOOK_S)
        now = stamp.read_bytes()
        if now != last:
            last, since = now, time.monotonic()
    # The hopper's last sign of life: its last stamp (it dies within a stamp period of it).
    last_stamp_s = stamp.stat().st_mtime - start  # below 0: its last stamp came before the clock's start
    return {
        "caught": not hoppers(stamp),
        "gone_s": round(max(0.0, last_stamp_s), 4),
        "last_stamp_s": round(last_stamp_s, 4),
    }


def one_run(way: str, src: Path, folder: Path, window_s: float, hierarchy: str) -> Dict[str, Any]:
    folder.mkdir(parents=True)
    stamp, ended = folder / "stamp", folder / "ended"
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONUNBUFFERED="1", HOME=str(folder))
    env.update(GPUPOOL_STATE=str(folder / "state"), GPUPOOL_DEVICES="emulated:1x16GiB")
    for name in ("GPUPOOL_SERVER", "GPUPOOL_CONFIG", "GPUPOOL_TOKEN", "GPUPOOL_LEASE_CGROUP"):
        env.pop(name, None)
    if hierarchy:
        env["GPUPOOL_LEASE_CGROUP"] = hierarchy
    argv = [sys.executable, "-m", "gpupool.cli.workload", "run", "-q", "-p", "0.5", "--"]
    runner = subprocess.Popen(
        argv + command(stamp, ended, hold=way == "kill9"),
        env=env,
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        if way == "kill9":
            deadline = time.monotonic() + 30
            while not (stamp.exists() and hoppers(stamp)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the hopper never started: {runner.stderr.read() if runner.stderr else ''}")
                time.sleep(_LOOK_S)
            start = time.time()
            runner.send_signal(signal.SIGKILL)
            runner.wait(timeout=30)
        else:
            runner.wait(timeout=60)
            if not ended.exists():
                raise RuntimeError(f"the command did not finish: {runner.stderr.read() if runner.stderr else ''}")
            start = float(ended.read_text())
        result = watch(stamp, start, window_s)
    finally:
        (folder / "stamp.stop").touch()  # an escaped hopper stops at its next stamp
        if runner.poll() is None:
            runner.kill()
        runner.wait()
        deadline = time.monotonic() + 10
        while hoppers(stamp) and time.monotonic() < deadline:
            time.sleep(0.05)
    return result


def summary(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    gone = sorted(r["gone_s"] for r in runs if r["caught"])
    return {
        "caught": sum(1 for r in runs if r["caught"]),
        "of": len(runs),
        "gone_s_median": round(statistics.median(gone), 4) if gone else None,
        "gone_s_max": round(gone[-1], 4) if gone else None,
        "caught_within_1s": sum(1 for g in gone if g <= 1.0),
    }


def measure(src: Path, runs: int, window_s: float, scratch: Path, hierarchy: str = "") -> Dict[str, Any]:
    """Each way `runs` times against `src`: {"src", way: summary, "runs": {way: [per run]}}."""
    which = subprocess.run(
        [sys.executable, "-c", "import gpupool; print(gpupool.__file__)"],
        env=dict(os.environ, PYTHONPATH=str(src)),
        cwd=scratch,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert which.startswith(str(src)), f"{which} is not from {src}"
    out: Dict[str, Any] = {"src": str(src), "runs": {}}
    for way in WAYS:
        results = []
        for i in range(runs):
            folder = scratch / f"{src.parent.name}{hierarchy}-{way}-{i}"
            results.append(one_run(way, src, folder, window_s, hierarchy))
            print(f"{src.parent.name} {hierarchy} {way} {i}: {results[-1]}", file=sys.stderr, flush=True)
        out[way] = summary(results)
        out["runs"][way] = results
    return out


def export_src(rev: str, into: Path) -> Path:
    """`rev`'s src/ under `into` (git archive: the working tree is left alone)."""
    into.mkdir(parents=True)
    archive = into / "src.tar"
    with open(archive, "wb") as handle:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], stdout=handle, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--window-s", type=float, default=5.0, help="how long a hopper may take to be gone")
    parser.add_argument("--before", help="also measure this git revision's src/ (the code before the fix)")
    parser.add_argument(
        "--v1", action="store_true", help="also measure the code now in the cgroup v1 freezer (GPUPOOL_LEASE_CGROUP=v1)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    figures: Dict[str, Any] = {
        "benchmark": "fork-escape",
        "runs_per_way": args.runs,
        "window_s": args.window_s,
        "hopper": {"hop_s": 0.0005, "lifetime_s": LIFETIME_S, "script": "tests/workload/runner/hopper.py"},
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "load_average_at_start": load_average(),
        },
    }
    with tempfile.TemporaryDirectory(prefix="gpupool-fork-escape-") as tmp:
        scratch = Path(tmp)
        measured = {}
        if args.before:
            measured["before"] = measure(export_src(args.before, scratch / "before"), args.runs, args.window_s, scratch)
        measured["after"] = measure(ROOT / "src", args.runs, args.window_s, scratch)
        if args.v1:
            measured["after_v1"] = measure(ROOT / "src", args.runs, args.window_s, scratch, "v1")
    figures["machine"]["load_average_at_end"] = load_average()
    # The summaries first (the docs' table), each run's figures apart.
    if args.before:
        figures["before"] = {"revision": args.before, **{w: measured["before"][w] for w in WAYS}}
    figures["after"] = {w: measured["after"][w] for w in WAYS}
    if args.v1:
        figures["after_v1"] = {w: measured["after_v1"][w] for w in WAYS}
    figures["per_run"] = {when: m["runs"] for when, m in measured.items()}
    write_and_show(figures, args.out)


if __name__ == "__main__":
    main()
