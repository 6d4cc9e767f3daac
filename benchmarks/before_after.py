"""Run one benchmark on an earlier commit's source and on this checkout's, in one run, as ratios.

A shared, noisy machine moves absolute figures from one run to the next; two runs side by side
meet the same load, so their ratio is the comparison. The benchmark script is this checkout's,
run twice with `python3` (this interpreter): PYTHONPATH first names the earlier commit's src/
(exported with `git archive`), then this checkout's src/; the dependencies come from the
interpreter's site-packages or the PYTHONPATH given. With --rounds N the two alternate N times
and the ratios are of the medians. The result file is the last "after" run's, with the last
"before" run, the headline ratios ("after_over_before"), each round's headline figures
("rounds") and the figures the file held before ("previous_file") beside it.

    python3 benchmarks/before_after.py pool --before 70f8f71 --after HEAD [--rounds 3] [-- --seconds 4]
    python3 benchmarks/before_after.py webhook --before 70f8f71 --after HEAD
    python3 benchmarks/before_after.py extender --before 70f8f71 --after HEAD
    python3 benchmarks/before_after.py push --before c317867 --after HEAD -- --cycles 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"
KEPT_APART = ("before", "after_over_before", "rounds", "after_src", "previous_file")


def _pool(result: Dict[str, Any]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for kind in ("http", "http_plain"):
        for level in result.get(kind, []):
            if level["clients"] == 16:
                out[f"{kind}_16_clients_claim_release_per_s"] = level["claim_release_per_s"]
                out[f"{kind}_16_clients_round_trip_p99_ms"] = level["round_trip_p99_ms"]
    return out


def _webhook(result: Dict[str, Any]) -> Dict[str, float]:
    return {
        "mutate_32_clients_p99_ms": result["mutate_32_clients"]["p99_ms"],
        "mutate_32_clients_rps": result["mutate_32_clients"]["rps"],
        "extender_filter_1000x8_p99_ms": result["extender_filter_1000x8"]["p99_ms"],
    }


def _extender(result: Dict[str, Any]) -> Dict[str, float]:
    return {
        f"{p['policy']}_filter_plus_prioritize_p99_ms": p["filter_plus_prioritize_ms"]["p99"]
        for p in result["policies"]
    }


def _push(result: Dict[str, Any]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for pool, figures in result["pools"].items():
        out[f"{pool}_median_s"] = figures["median_s"]
        for kind, each in figures["kinds"].items():
            out[f"{pool}_{kind}_median_s"] = each["median_s"]
    return out


HEADLINES: Dict[str, Callable[[Dict[str, Any]], Dict[str, float]]] = {
    "pool": _pool,
    "push": _push,
    "webhook": _webhook,
    "extender": _extender,
}


def export_src(rev: str, into: Path) -> Path:
    """`rev`'s src/ under `into` (git archive: the repository's worktrees are left alone)."""
    into.mkdir(parents=True)
    archive = into / "src.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_bench(name: str, src: Path, out: Path, extra: List[str]) -> Dict[str, Any]:
    """The benchmark script of this checkout, importing gpupool from `src`."""
    path = [str(src), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    command = [sys.executable, str(HERE / f"bench_{name}.py"), "--out", str(out), *extra]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return dict(json.loads(out.read_text()))


def previous(path: Path, rev: str) -> Optional[Dict[str, Any]]:
    """The figures the result file held before this run, without an earlier comparison's parts;
    when it holds a comparison with the same earlier commit (a re-run), the figures that one kept."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if (data.get("before") or {}).get("src") == rev and "previous_file" in data:
        return dict(data["previous_file"])
    return {k: v for k, v in data.items() if k not in KEPT_APART}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", choices=sorted(HEADLINES))
    parser.add_argument("--before", required=True, metavar="REV", help="the earlier commit (any git revision)")
    parser.add_argument(
        "--after", metavar="REV", help="a later commit instead of this checkout's src/ (uncommitted changes included)"
    )
    parser.add_argument("--out", help="the result file (default benchmarks/results/BENCH.json)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="runs of each, alternating before and after; the ratios are of the medians (default 1)",
    )
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []  # after --: the benchmark script's own
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if extra or "--" in argv else 0)])
    target = Path(args.out or HERE / "results" / f"{args.bench}.json")
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.before], capture_output=True, text=True, check=True
    ).stdout.strip()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.after or "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    earlier = previous(target, rev)
    with tempfile.TemporaryDirectory() as tmp:
        before_src = export_src(rev, Path(tmp) / "before")
        after_src = export_src(head, Path(tmp) / "after") if args.after else ROOT / "src"
        rounds: List[Dict[str, Dict[str, float]]] = []
        for _ in range(max(1, args.rounds)):  # alternating, so a change of load meets both
            before = run_bench(args.bench, before_src, Path(tmp) / "before.json", extra)
            after = run_bench(args.bench, after_src, Path(tmp) / "after.json", extra)
            rounds.append({"before": HEADLINES[args.bench](before), "after": HEADLINES[args.bench](after)})
    old, new = (_medians([r[side] for r in rounds]) for side in ("before", "after"))
    result = dict(after)  # the last round's runs in full
    result["after_src"] = head if args.after else f"{head} (this checkout's src/, uncommitted changes included)"
    result["before"] = {"src": rev, "run": "the same script, alternating with the after runs", **before}
    result["after_over_before"] = {k: round(new[k] / old[k], 3) for k in new if old.get(k)}
    if len(rounds) > 1:
        result["rounds"] = rounds
    if earlier is not None:
        result["previous_file"] = earlier
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"before": old, "after": new, "after_over_before": result["after_over_before"]}, indent=2))
    return 0


def _medians(runs: List[Dict[str, float]]) -> Dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


if __name__ == "__main__":
    sys.exit(main())
