"""Launcher benchmark: the whole-process wall time of `gpupool run -n 1 -p 0.5 -- true`, paired with `python -c pass`.

What a user pays before every job: interpreter start, imports, the claim, the
guard fork, starting `true`, the release, exit. Each case is timed as a whole
process (fork+exec to exit, as `/usr/bin/time` would), for `--runs` rounds after
`--warmup` untimed ones; every timed run sits right next to a bare
`python -c pass` of the same interpreter, so a busy machine slows both alike.
The figure to read is `ratio`: the case's median over the bare interpreter's
median (`pair_ratio_median` is the median of the per-pair ratios); `cpu_ratio` is
the same for user+system CPU time, which a busy machine disturbs much less.

The install is timed as `make install` leaves it: the gpupool package the interpreter
imports is compiled first (`compileall`, as pip does for a wheel; an editable install
runs from src/, where an edit since the last compile would otherwise be timed as
compiling at every start, PYTHONDONTWRITEBYTECODE being set).

Cases (emulated GPUs, GPUPOOL_DEVICES=emulated:2x16GiB, fresh state dirs, HOME in
a temporary folder so no client config is read):
- embedded_entry_point: the installed `gpupool` script, embedded pool
- embedded_python_m:    `python -m gpupool`, embedded pool
- embedded_zipapp:      `python gpupool-run.pyz` built by tools/build_pyz.py, embedded pool
- server_entry_point:   the `gpupool` script against a local `gpupool server` subprocess
                        (loopback, auth on: the token in GPUPOOL_TOKEN)
- stdlib_floor:         not gpupool: `python -c "import ..."` of exactly the standard-library
                        modules an embedded `gpupool run` imports (read from its `-X importtime`);
                        what the run would cost if gpupool's own modules and the run's work
                        (claim, guard, command, release) cost nothing

With `--baseline DIR` (a checkout of other code, e.g. `git worktree add /tmp/old HEAD~1`), each
embedded case and the server case run a second time as `before_<case>` with that checkout's
src/ first on PYTHONPATH (its zipapp built by its own tools/build_pyz.py, its install prepared
by its own Makefile's `install` steps), in the same rounds as the code here.

Writes benchmarks/results/launcher.json and prints it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import serverproc  # beside this script

from gpupool.core.percentile import percentile

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
RUN = ["run", "-q", "-n", "1", "-p", "0.5", "--", "true"]
DEVICES = "emulated:2x16GiB"


def timed(argv: Sequence[str], env: Dict[str, str]) -> Tuple[float, float]:
    """(wall, CPU) seconds of one process from start to exit; its output discarded, a failure fatal.

    CPU is user+system of the process and of the children it waited for (the command, the
    guard once reaped): a busy machine stretches wall time far more than CPU time.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{err.decode(errors='replace')}")
    return elapsed, usage.ru_utime + usage.ru_stime


def start_server(state: Path, env: Dict[str, str]) -> Tuple[subprocess.Popen, str, str]:
    """A `gpupool server` subprocess on loopback: (process, URL, admin token)."""
    state.mkdir(parents=True, exist_ok=True)
    token_file = state / "token"
    proc, url = serverproc.start_server(state / "pool", token_file, state / "server.log", DEVICES, env)
    return proc, url, token_file.read_text().strip()


def prepare_install(python: str, env: Dict[str, str], checkout: Path = REPO) -> str:
    """Run the `install` steps of `checkout`'s Makefile (the lines that call `$(BIN)/python`: today
    compileall) for the gpupool package `python` imports in `env`; returns the package's folder."""
    where = subprocess.run(
        [python, "-c", "import gpupool, os; print(os.path.dirname(gpupool.__file__))"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    for step in install_steps(checkout):
        subprocess.run([python, *step], check=True, capture_output=True, cwd=checkout, env=env)
    return where


def install_steps(checkout: Path) -> List[List[str]]:
    """The `$(BIN)/python ARGS` lines of the `install` target in `checkout`'s Makefile, as ARGS."""
    steps, inside = [], False
    for line in (checkout / "Makefile").read_text().splitlines():
        if line.startswith("install:"):
            inside = True
        elif inside and line.startswith("\t"):
            words = line.strip().lstrip("-").split()
            if words and words[0] == "$(BIN)/python":
                steps.append(words[1:])
        elif inside:
            break
    return steps


def imported_modules(argv: Sequence[str], env: Dict[str, str]) -> List[str]:
    """The modules a process imports, in the order they finish (`python -X importtime`)."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
    names = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                names.append(name)
    return names


def exists(name: str) -> bool:
    """Whether module `name` can be imported here (its parent package too)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def stdlib_floor_argv(python: str, run_argv: Sequence[str], env: Dict[str, str]) -> List[str]:
    """`python -c` importing the public standard-library modules `run_argv` imports beyond the
    interpreter's start (their private helpers follow)."""
    at_start = set(imported_modules([python, "-c", "pass"], env))
    modules = [
        name
        for name in imported_modules(run_argv, env)
        if name not in at_start
        and not name.startswith("gpupool")
        and not any(part.startswith("_") and not part.endswith("__") for part in name.split("."))
        and exists(name)  # not a probe that failed (subprocess's `msvcrt`, copy's `org.python.core`)
    ]
    return [python, "-c", f"import {', '.join(dict.fromkeys(modules))}"]


def build_zipapp(target: Path, checkout: Path = REPO) -> Path:
    """`checkout`'s gpupool-run.pyz, built by its own tools/build_pyz.py."""
    subprocess.run(
        [sys.executable, str(checkout / "tools" / "build_pyz.py"), str(target)], check=True, capture_output=True
    )
    return target


def summary(case: List[Tuple[float, float]], bare: List[Tuple[float, float]]) -> Dict[str, float]:
    """Wall-time medians in ms, the ratio of medians, the median of per-pair ratios; the same for CPU."""
    wall, bare_wall = [w for w, _ in case], [w for w, _ in bare]
    cpu, bare_cpu = [c for _, c in case], [c for _, c in bare]
    return {
        "median_ms": round(statistics.median(wall) * 1000, 1),
        "bare_median_ms": round(statistics.median(bare_wall) * 1000, 1),
        "ratio": round(statistics.median(wall) / statistics.median(bare_wall), 2),
        "pair_ratio_median": round(statistics.median(c / b for c, b in zip(wall, bare_wall)), 2),
        "min_ms": round(min(wall) * 1000, 1),
        "p90_ms": round(percentile(wall, 90) * 1000, 1),
        "cpu_median_ms": round(statistics.median(cpu) * 1000, 1),
        "bare_cpu_median_ms": round(statistics.median(bare_cpu) * 1000, 1),
        "cpu_ratio": round(statistics.median(cpu) / statistics.median(bare_cpu), 2),
        "runs": len(wall),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs per case (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    parser.add_argument(
        "--cases", default="all", help="comma-separated case names (default all: see the module docstring)"
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "launcher.json"))
    parser.add_argument(
        "--baseline", type=Path, help="a checkout of other code, timed beside this one as before_<case>"
    )
    args = parser.parse_args()

    python = sys.executable
    script = Path(python).parent / "gpupool"
    load_at_start = os.getloadavg()
    baseline_package = ""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env.update(HOME=str(tmp), GPUPOOL_DEVICES=DEVICES)
        package = prepare_install(python, env)
        pyz = build_zipapp(tmp / "gpupool-run.pyz")
        server, url, token = start_server(tmp / "server", env)
        try:
            cases: Dict[str, Tuple[List[str], Dict[str, str]]] = {
                "embedded_entry_point": ([str(script), *RUN], dict(env, GPUPOOL_STATE=str(tmp / "s1"))),
                "embedded_python_m": ([python, "-m", "gpupool", *RUN], dict(env, GPUPOOL_STATE=str(tmp / "s2"))),
                "embedded_zipapp": ([python, str(pyz), *RUN], dict(env, GPUPOOL_STATE=str(tmp / "s3"))),
                "server_entry_point": ([str(script), *RUN], dict(env, GPUPOOL_SERVER=url, GPUPOOL_TOKEN=token)),
            }
            if args.baseline is not None:
                old = args.baseline.resolve()
                old_env = dict(env, PYTHONPATH=str(old / "src"))
                baseline_package = prepare_install(python, old_env, old)
                old_pyz = build_zipapp(tmp / "before-gpupool-run.pyz", old)
                for name, (argv, case_env) in list(cases.items()):
                    if name == "embedded_zipapp":
                        argv = [python, str(old_pyz), *RUN]
                    state = (
                        {"GPUPOOL_STATE": case_env["GPUPOOL_STATE"] + "-before"} if "GPUPOOL_STATE" in case_env else {}
                    )
                    cases[f"before_{name}"] = (argv, dict(case_env, PYTHONPATH=old_env["PYTHONPATH"], **state))
            floor_env = dict(env, GPUPOOL_STATE=str(tmp / "s4"))
            cases["stdlib_floor"] = (stdlib_floor_argv(python, [python, str(script), *RUN], floor_env), env)
            if args.cases != "all":
                cases = {name: cases[name] for name in args.cases.split(",")}
            bare_argv = [python, "-c", "pass"]
            times: Dict[str, List[Tuple[float, float]]] = {name: [] for name in cases}
            bare: Dict[str, List[Tuple[float, float]]] = {name: [] for name in cases}
            for round_ in range(args.warmup + args.runs):
                for i, (name, (argv, case_env)) in enumerate(cases.items()):
                    # Alternate which of the pair goes first, so neither always runs on a warmer cache.
                    first_bare = (round_ + i) % 2 == 0
                    b0 = timed(bare_argv, env) if first_bare else None
                    t = timed(argv, case_env)
                    b = b0 if b0 is not None else timed(bare_argv, env)
                    if round_ >= args.warmup:
                        times[name].append(t)
                        bare[name].append(b)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(10)

    results = {name: summary(times[name], bare[name]) for name in cases}
    figures = {
        "command": "gpupool " + " ".join(RUN),
        "bare": f"{python} -c pass",
        "method": f"whole processes, {args.runs} timed runs per case after {args.warmup} warm-up rounds, each run "
        "paired with a bare `python -c pass` of the same interpreter right before or after it",
        "install": f"{package}, compiled first (as `make install`)",
        "baseline": None
        if args.baseline is None
        else f"before_*: {baseline_package} (checkout {args.baseline}, its `make install` steps run first)",
        "load_average_at_start": [round(x, 2) for x in load_at_start],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
        },
        "cases": results,
        "target": "embedded_entry_point median <= 80 ms on this machine (issue 24)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
