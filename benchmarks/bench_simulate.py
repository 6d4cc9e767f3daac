"""Every placement policy on the shared openb trace (Alibaba, FGD paper, USENIX ATC '23) at 130 % arrival,
3 seeds, beside the paper's published figures; then the default policy against FGD and binpack on
workload variants (more sharing, more multi-GPU tasks, more CPU-only tasks, GPU-model constraints).

Each replay runs in one process on one core (--jobs runs several at once; the seconds reported
are each replay's own). Saves everything to benchmarks/results/simulate.json.

    python benchmarks/bench_simulate.py [--seeds 1 2 3] [--jobs 2] [--no-variants]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from gpupool.simulate import variants
from gpupool.simulate.policies import DEFAULT_POLICY, POLICIES, make_policy
from gpupool.simulate.replay import replay_arrival
from gpupool.simulate.trace import Task, read_nodes, read_tasks

TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
RESULTS = Path(__file__).resolve().parent / "results" / "simulate.json"

# experiments/analysis/expected_results/analysis_allo_discrete.csv of hkust-adsl/kubernetes-scheduler-simulator:
# 100 - allocated GPU % at 130 % arrival on openb_pod_list_default, mean of its 10 seeds (42..51).
PAPER = {
    "random": ("Random fit", 12.53),
    "dotprod": ("Dot product", 9.15),
    "clustering": ("GPU clustering", 8.12),
    "packing": ("GPU packing", 8.00),
    "bestfit": ("Best fit", 6.92),
    "fgd": ("FGD", 4.61),
}
# The variants each policy faces besides the default trace (name -> builder).
VARIANTS = {
    "sharing 80 %": lambda tasks, nodes: variants.more_sharing(tasks, 0.8, seed=7),
    "multi-GPU 30 %": lambda tasks, nodes: variants.more_multi_gpu(tasks, 0.3, seed=7),
    "CPU-only x2.5": lambda tasks, nodes: variants.more_cpu_only(tasks, 2.5, seed=7),
    "GPU models 33 %": lambda tasks, nodes: variants.model_constraints(tasks, nodes, 0.33, seed=7),
}
VARIANT_POLICIES = (DEFAULT_POLICY, "fgd", "binpack")

_NODES: Optional[list] = None
_WORKLOADS: Dict[str, List[Task]] = {}


def _setup(nodes_csv: str, pods_csv: str, with_variants: bool) -> None:
    global _NODES
    _NODES = read_nodes(Path(nodes_csv))
    tasks = read_tasks(Path(pods_csv))
    _WORKLOADS["default"] = tasks
    if with_variants:
        for name, build in VARIANTS.items():
            _WORKLOADS[name] = build(tasks, _NODES)


def _one(job: Tuple[str, str, int, float]) -> Dict[str, Any]:
    workload, policy_name, seed, arrive = job
    tasks = _WORKLOADS[workload]
    assert _NODES is not None
    policy = make_policy(policy_name, [t.shape for t in tasks])
    result = replay_arrival(_NODES, tasks, policy, arrive, seed)
    out = result.to_dict()
    out.pop("curve")
    out["workload"] = workload
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default=str(TRACE / "openb_node_list_gpu_node.csv"))
    parser.add_argument("--pods", default=str(TRACE / "openb_pod_list_default.csv"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--arrive", type=float, default=1.3)
    parser.add_argument("--jobs", type=int, default=1, help="replays at once (each on one core)")
    parser.add_argument("--no-variants", action="store_true", help="only the trace as it is")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    jobs = [("default", p, s, args.arrive) for p in POLICIES for s in args.seeds]
    if not args.no_variants:
        jobs += [(v, p, s, args.arrive) for v in VARIANTS for p in VARIANT_POLICIES for s in args.seeds]
    started = time.perf_counter()
    init = (args.nodes, args.pods, not args.no_variants)
    if args.jobs > 1:
        with multiprocessing.Pool(args.jobs, initializer=_setup, initargs=init) as pool:
            rows = pool.map(_one, jobs, chunksize=1)
    else:
        _setup(*init)
        rows = []
        for job in jobs:
            rows.append(_one(job))
            print(
                f"  {job[0]:>16} {job[1]:>10} seed {job[2]}: {rows[-1]['unallocated_gpu_percent']:.2f} %"
                f" in {rows[-1]['seconds']:.1f} s",
                file=sys.stderr,
            )
    wall = time.perf_counter() - started

    def cell(workload: str, policy: str) -> List[Dict[str, Any]]:
        return [r for r in rows if r["workload"] == workload and r["policy"] == policy]

    print(
        f"\nGPUs left unallocated at {args.arrive * 100:.0f} % arrival, openb default trace "
        f"(1,213 nodes, 6,212 GPUs), seeds {', '.join(map(str, args.seeds))}"
    )
    print(f"{'policy':<22}{'mean':>7}  {'per seed':<24}{'first failure':>14}{'s/replay':>10}   paper (10 seeds)")
    summary: Dict[str, Any] = {}
    for p in POLICIES:
        rs = cell("default", p)
        values = [r["unallocated_gpu_percent"] for r in rs]
        mean = statistics.mean(values)
        first = statistics.mean(r["first_failure_arrival_percent"] or 0 for r in rs)
        secs = max(r["seconds"] for r in rs)
        paper = PAPER.get(p)
        label = f"gpupool {p}" + (" (default)" if p == DEFAULT_POLICY else "")
        per = ", ".join(f"{v:.2f}" for v in values)
        print(
            f"{label:<22}{mean:>6.2f}%  {per:<24}{first:>13.1f}%{secs:>10.1f}   "
            + (f"{paper[0]} {paper[1]:.2f} %" if paper else "")
        )
        summary[p] = {
            "mean": round(mean, 3),
            "seeds": values,
            "first_failure_arrival_percent": round(first, 2),
            "max_seconds": secs,
        }
    for key in ("dotprod", "clustering", "packing", "bestfit"):
        print(f"{'':<22}{'':>7}  {'':<24}{'':>14}{'':>10}   {PAPER[key][0]} {PAPER[key][1]:.2f} %")

    variant_summary: Dict[str, Any] = {}
    if not args.no_variants:
        print("\nVariants (built from the trace by gpupool.simulate.variants, seed 7), mean of the seeds:")
        print(f"{'workload':<18}" + "".join(f"{p:>12}" for p in VARIANT_POLICIES))
        for v in VARIANTS:
            means = {p: statistics.mean(r["unallocated_gpu_percent"] for r in cell(v, p)) for p in VARIANT_POLICIES}
            print(f"{v:<18}" + "".join(f"{means[p]:>11.2f}%" for p in VARIANT_POLICIES))
            variant_summary[v] = {p: round(m, 3) for p, m in means.items()}

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "simulate",
                "trace": {"nodes": args.nodes, "pods": args.pods},
                "arrive": args.arrive,
                "seeds": args.seeds,
                "paper_mean_10_seeds": {k: v[1] for k, v in PAPER.items()},
                "summary": summary,
                "variants": variant_summary,
                "runs": rows,
                "wall_seconds": round(wall, 1),
                "machine": {
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                },
            },
            indent=1,
        )
        + "\n"
    )
    print(f"\nsaved {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
