"""Issue 38's GPU figures: `gpupool bench isolation`, one part and mode at a time, into benchmarks/results/.

    python benchmarks/bench_isolation_gpu.py [--quick]

On a machine with an NVIDIA GPU and the MPS control binary (no server extras needed: the rounds use
the embedded pool). Each invocation's part file is copied to
benchmarks/results/gpu-isolation-<part>-<modes>.json, as `gpupool bench isolation` wrote it. --quick shortens the windows to fit a short GPU lease (the
durations the committed files were measured with are in them: `window_s`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# (part, modes, extra flags): the time-sliced split shows what the hooks do not promise; MPS all three.
PLAN = [
    ("splits", "hooks", ["--pairs", "0.1/0.9"]),
    ("splits", "mps", []),
    ("neighbour", "hooks", []),
    ("neighbour", "mps", []),
    ("caps", "mps", []),
]
QUICK = ["--split-seconds", "30", "--alone-seconds", "6", "--neighbour-seconds", "12", "--caps-seconds", "100"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short windows, for a short GPU lease")
    p.add_argument("--only", default="", help="PART-MODES items to run, comma separated (e.g. splits-mps)")
    args = p.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    failed = 0
    for part, modes, extra in PLAN:
        name = f"{part}-{modes}"
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"gpupool-iso-{name}-") as tmp:
            out = Path(tmp)
            command = [sys.executable, "-m", "gpupool", "bench", "isolation", "--out", str(out), "--parts", part]
            command += ["--modes", modes, *extra, *(QUICK if args.quick else [])]
            print(f"== {' '.join(command[1:])}", file=sys.stderr, flush=True)
            failed |= subprocess.run(command, cwd=ROOT).returncode != 0
            if (out / f"{part}.json").exists():
                shutil.copyfile(out / f"{part}.json", RESULTS / f"gpu-isolation-{name}.json")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
