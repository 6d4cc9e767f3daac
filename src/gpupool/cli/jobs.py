"""`gpupool jobs`, `gpupool logs` and `gpupool cancel`: jobs submitted with `gpupool submit`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..jobs.executors import TARGETS, Executor
from .pool_options import print_pool


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--target", default="local", choices=TARGETS, help="where the job runs (default: local)")
        p.add_argument(
            "--state",
            metavar="DIR",
            help="state dir holding local jobs (default: $GPUPOOL_STATE or ~/.local/state/gpupool)",
        )
        p.add_argument("--namespace", help="Kubernetes namespace (default: 'default')")

    jobs = subparsers.add_parser(
        "jobs", help="list submitted jobs with their state", description="List jobs and their replicas' state."
    )
    jobs.add_argument("name", nargs="?", help="show one job in detail")
    jobs.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common(jobs)
    jobs.set_defaults(func=_jobs)

    logs = subparsers.add_parser("logs", help="print a job's logs", description="Print a job's replica logs.")
    logs.add_argument("name", help="job name")
    logs.add_argument("--replica", help="one replica, e.g. worker-1 (default: all, prefixed)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    common(logs)
    logs.set_defaults(func=_logs)

    cancel = subparsers.add_parser(
        "cancel", help="stop a job and free its GPUs", description="Stop every replica of a job and release its lease."
    )
    cancel.add_argument("name", help="job name")
    common(cancel)
    cancel.set_defaults(func=_cancel)


def _executor(args: argparse.Namespace) -> Executor:
    from ..jobs.executors import get_executor

    return get_executor(
        args.target, state_dir=Path(args.state).expanduser() if args.state else None, namespace=args.namespace
    )


def _print_pool(executor: Executor, file: Any = None) -> None:
    """The pool line of a local job verb: the state dir whose jobs it read (a Kubernetes target's
    jobs live in the cluster, which names no pool)."""
    from ..jobs.executors.local import LocalExecutor

    if isinstance(executor, LocalExecutor):
        print_pool(f"embedded:{executor.store.state_dir}", file)


def _ago(ts: Any) -> str:
    if not ts:
        return "-"
    s = max(0, int(time.time() - ts))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _jobs(args: argparse.Namespace) -> int:
    executor = _executor(args)
    found = [executor.describe(args.name)] if args.name else executor.list()
    if args.json:
        print(json.dumps([d.to_dict() for d in found], indent=2))
        return 0
    _print_pool(executor)
    if not found:
        print("no jobs", file=sys.stderr)
        return 0
    from ..jobs.phase import Phase

    print(f"{'NAME':24} {'STATUS':11} {'REPLICAS':9} {'RESTARTS':8} {'AGE':5}  MESSAGE")
    for d in found:
        running = sum(1 for r in d.replicas if r.status is Phase.RUNNING)
        print(
            f"{d.name:24} {d.status.value:11} {running}/{len(d.replicas):<7} {d.restarts:<8} "
            f"{_ago(d.submitted_at):5}  {d.message}"
        )
        if args.name:
            for r in d.replicas:
                code = "" if r.exit_code is None else f" exit {r.exit_code}"
                gpus = f" gpus {r.devices}" if r.devices else ""
                print(f"  {r.name:22} {r.status.value}{code} restarts {r.restarts}{gpus}")
    return 0


def _logs(args: argparse.Namespace) -> int:
    from ..jobs.phase import Phase

    executor = _executor(args)
    job = executor.describe(args.name)
    _print_pool(executor, sys.stderr)  # stdout is the job's own output
    if job.status in (Phase.QUEUED, Phase.PENDING):  # no replica has written yet: say why, not nothing
        why = f": {job.message}" if job.message else ""
        print(f"gpupool: job {args.name} is {job.status.value.lower()}{why}", file=sys.stderr, flush=True)
    for line in executor.log_lines(args.name, args.replica, args.follow):
        print(line, flush=True)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    executor = _executor(args)
    message = executor.cancel(args.name)
    _print_pool(executor, sys.stderr)
    print(message, file=sys.stderr)
    return 0


def follow_to_end(executor: Executor, name: str) -> int:
    """Stream all replicas' logs until the job ends; Ctrl-C cancels the job. Exit 0 on success."""
    from ..jobs.phase import Phase

    try:
        for line in executor.log_lines(name, None, True):
            print(line, flush=True)
        final = executor.wait(name)
    except KeyboardInterrupt:
        print(f"\ncancelling job {name} ...", file=sys.stderr)
        print(executor.cancel(name), file=sys.stderr)
        return 130
    print(f"job {name} {final.status.value.lower()}: {final.message}", file=sys.stderr)
    return 0 if final.status is Phase.SUCCEEDED else 1
