"""`gpupool simulate`: replay a cluster and a workload through the placement policies and report what is left."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `simulate`."""
    from ..simulate.policies import DEFAULT_POLICY, POLICIES

    p = subparsers.add_parser(
        "simulate",
        help="replay a cluster and a workload through the placement policies",
        description=(
            "Replays tasks onto a cluster through gpupool's placement code and reports the GPUs left "
            "unallocated, fragmentation, the arrival level of the first failure and the tasks placed. "
            "--mode arrival (default) is the FGD paper's method: tasks drawn at random, no departures, "
            "until the GPUs asked for reach --arrive times the cluster's."
        ),
    )
    p.add_argument(
        "--nodes",
        required=True,
        type=Path,
        help="cluster: openb node CSV (sn,cpu_milli,memory_mib,gpu,model) or a saved `gpupool status --json` (.json)",
    )
    p.add_argument(
        "--pods",
        required=True,
        type=Path,
        help="workload: openb pod CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...,creation_time,deletion_time)",
    )
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        help=f"{', '.join(POLICIES)}, or 'all' to compare them (default {DEFAULT_POLICY})",
    )
    p.add_argument("--mode", choices=("arrival", "timeline"), default="arrival")
    p.add_argument("--arrive", type=float, default=1.3, help="arrival mode: GPUs asked for, times the cluster's (1.3)")
    p.add_argument("--seed", type=int, default=1, help="random order, draws and ties (1)")
    p.add_argument(
        "--json", action="store_true", help="one JSON object per policy on stdout (unallocated_gpu_percent ...)"
    )
    p.add_argument("--out", type=Path, help="write result.json and curve.png (unallocated GPUs against arrival) here")
    p.set_defaults(func=handle_simulate)


def handle_simulate(args: argparse.Namespace) -> int:
    from ..core.errors import InvalidInput
    from ..simulate import report
    from ..simulate.policies import POLICIES, make_policy
    from ..simulate.replay import Result, replay_arrival, replay_timeline
    from ..simulate.trace import read_nodes, read_tasks

    if args.arrive <= 0:
        raise InvalidInput(f"--arrive {args.arrive} must be > 0 (1.3 = tasks asking for 130 % of the cluster's GPUs)")
    names = list(POLICIES) if args.policy == "all" else [args.policy]
    nodes = read_nodes(args.nodes)
    tasks = read_tasks(args.pods)
    workload = [t.shape for t in tasks]
    results: List[Result] = []
    for name in names:
        policy = make_policy(name, workload)
        bar = report.ProgressBar(f"{name:>10}")
        if args.mode == "arrival":
            result = replay_arrival(nodes, tasks, policy, args.arrive, args.seed, progress=bar)
        else:
            result = replay_timeline(nodes, tasks, policy, args.seed, progress=bar)
        results.append(result)
        if args.json:
            report.write_json(result, sys.stdout)
        else:
            print(report.text(result))
        sys.stdout.flush()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        body = [r.to_dict() for r in results]
        (args.out / "result.json").write_text(json.dumps(body[0] if len(body) == 1 else body, indent=1) + "\n")
        why_not = report.plot(results, args.out / "curve.png")
        print(
            f"gpupool: {why_not}"
            if why_not
            else f"gpupool: wrote {args.out / 'result.json'} and {args.out / 'curve.png'}",
            file=sys.stderr,
        )
    return 0
