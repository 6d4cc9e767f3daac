"""`gpupool bench scaling|share`: images/s against GPU count, and against sharing one GPU."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, List, Tuple

from .groups import help_when_bare
from .pool_options import add_pool_arguments


def register(subparsers: Any) -> None:
    """Add `bench scaling`, `bench share` and `bench isolation`."""
    bench = subparsers.add_parser(
        "bench",
        help="throughput reports: scaling over GPUs, sharing one GPU",
        description="Train the reference model as pool jobs and report images/s: `scaling` runs one "
        "data-parallel job per GPU count, `share` runs 1/f concurrent jobs on one GPU per fraction f. "
        "Writes OUT/report.json, OUT/report.md and OUT/report.png.",
    )
    verbs = bench.add_subparsers(dest="bench_command", metavar="KIND")
    scaling = verbs.add_parser(
        "scaling",
        help="one data-parallel job per GPU count: throughput, efficiency, step times",
        description="For each GPU count N, a data-parallel job of N workers, each on a whole GPU (or "
        "--fraction of one), claimed from the pool as one gang and run by the local executor.",
    )
    scaling.add_argument("--gpus", default="1,2,4,8", help="GPU counts, comma separated (default 1,2,4,8)")
    scaling.add_argument("--fraction", default="1", help="share of each GPU per worker (default 1: whole GPUs)")
    share = verbs.add_parser(
        "share",
        help="1/f concurrent jobs on one GPU for each fraction f: aggregate, slowdown, fairness",
        description="For each fraction f, 1/f concurrent single-worker jobs on one GPU, each holding f; "
        "compared with one job on the whole GPU (fraction 1 always runs first).",
    )
    share.add_argument("--fractions", default="1,0.5,0.25", help="shares of the GPU (default 1,0.5,0.25)")
    share.add_argument("--gpu-index", type=int, default=0, help="the GPU every job lands on (default 0)")
    for p in (scaling, share):
        _common(p)
        p.set_defaults(func=_bench)
    _isolation_parser(verbs)
    help_when_bare(bench)


def _isolation_parser(verbs: Any) -> None:
    from ..bench.isolation.rounds import Settings

    p = verbs.add_parser(
        "isolation",
        help="whether compute splits, a latency-sensitive neighbour and memory caps hold on a real GPU",
        description="Runs probes as leases' commands under `gpupool run` on an embedded pool (one state "
        "dir per isolation mode under OUT/state): two matmul leases per compute split, batch-1 inference "
        "beside a trainer per isolation mode, and many over-allocating starts while the MPS daemon is killed. "
        "Writes OUT/splits.json, OUT/neighbour.json, OUT/caps.json and OUT/report.md.",
    )
    p.add_argument("--out", required=True, help="folder for the parts' JSON, report.md and the rounds' logs")
    p.add_argument("--parts", default="splits,neighbour,caps", help="which parts, comma separated (default all)")
    p.add_argument(
        "--modes", default="hooks,mps", help="isolation modes the splits and the neighbour run in (default hooks,mps)"
    )
    p.add_argument(
        "--pairs", default="0.1/0.9,0.25/0.75,0.5/0.5", help="compute splits (default 0.1/0.9,0.25/0.75,0.5/0.5)"
    )
    p.add_argument("--split-seconds", type=float, default=60.0, help="each split's window (default 60)")
    p.add_argument("--alone-seconds", type=float, default=15.0, help="each probe alone (default 15)")
    p.add_argument("--neighbour-seconds", type=float, default=30.0, help="each neighbour round's window (default 30)")
    p.add_argument("--inference-share", default="0.25", help="the inference lease's share (default 0.25)")
    p.add_argument(
        "--caps-share",
        default=None,
        help="the over-allocating jobs' share (default: what lets --concurrent of them fit on one GPU, at most 0.25)",
    )
    p.add_argument("--starts", type=int, default=1000, help="over-allocating starts (default 1000)")
    p.add_argument("--concurrent", type=int, default=16, help="starts at a time (default 16)")
    p.add_argument(
        "--kill-every", type=float, default=5.0, help="seconds between MPS daemon kills; 0: none (default 5)"
    )
    p.add_argument("--caps-seconds", type=float, default=600.0, help="no start begins after this long (default 600)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (the harness's own test)")
    p.add_argument(
        "--matmul-size", type=int, default=Settings.matmul_size, help="the matmul probe's side (default %(default)s)"
    )
    p.add_argument(
        "--model", default=Settings.model, help="the inference and trainer model (torchvision; default %(default)s)"
    )
    p.add_argument("--image-size", type=int, default=Settings.image_size, help="their input side (default %(default)s)")
    p.add_argument(
        "--train-batch", type=int, default=Settings.train_batch, help="the trainer's batch (default %(default)s)"
    )
    p.add_argument(
        "--interval",
        type=float,
        default=Settings.interval_s,
        help="seconds between inference requests (default %(default)s)",
    )
    p.add_argument("--ttl", type=float, default=Settings.ttl_s, help="lease TTL in seconds (default %(default)s)")
    p.set_defaults(func=_isolation)


def _split_pairs(text: str) -> List[Tuple[float, float]]:
    from ..core.errors import InvalidInput
    from ..core.quantity import parse_fraction

    pairs = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        first, slash, second = item.partition("/")
        if not slash:
            raise InvalidInput(f"--pairs item {item!r} is not FIRST/SECOND: write e.g. 0.1/0.9")
        a, b = parse_fraction(first, "--pairs share"), parse_fraction(second, "--pairs share")
        if a + b > 1 + 1e-9:
            raise InvalidInput(
                f"--pairs item {item!r} asks for more than one GPU: the two shares must sum to 1 or less"
            )
        pairs.append((a, b))
    return pairs


def _isolation(args: argparse.Namespace) -> int:
    from ..bench.isolation.harness import PARTS, run_parts
    from ..bench.isolation.rounds import Settings
    from ..core.errors import InvalidInput
    from ..core.isolation_mode import IsolationMode
    from ..core.quantity import parse_fraction

    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = [x for x in parts if x not in PARTS]
    if unknown or not parts:
        raise InvalidInput(f"--parts {args.parts!r} is unknown: use some of {','.join(PARTS)}")
    modes = [IsolationMode.parse(x) for x in args.modes.split(",") if x.strip()]
    for flag, value in (
        ("--split-seconds", args.split_seconds),
        ("--alone-seconds", args.alone_seconds),
        ("--neighbour-seconds", args.neighbour_seconds),
        ("--interval", args.interval),
        ("--ttl", args.ttl),
        ("--caps-seconds", args.caps_seconds),
    ):
        if not 0 < value <= 3600:
            raise InvalidInput(f"{flag} {value:g} must be above 0 and at most 3600 seconds")
    for flag, count, top in (("--starts", args.starts, 100_000), ("--concurrent", args.concurrent, 64)):
        if not 1 <= count <= top:
            raise InvalidInput(f"{flag} {count} must be between 1 and {top}")
    if not 0 <= args.kill_every <= 3600:
        raise InvalidInput(f"--kill-every {args.kill_every:g} must be between 0 (no kills) and 3600 seconds")
    if args.device not in ("cuda", "cpu"):
        raise InvalidInput(f"--device {args.device!r} is unknown: use cuda or cpu")
    settings = Settings(
        out=Path(args.out).resolve(),
        device=args.device,
        matmul_size=args.matmul_size,
        model=args.model,
        image_size=args.image_size,
        train_batch=args.train_batch,
        interval_s=args.interval,
        ttl_s=args.ttl,
        progress=lambda text: print(f"gpupool bench isolation: {text}", file=sys.stderr, flush=True),
    )
    results = run_parts(
        settings,
        parts,
        modes=modes,
        pairs=_split_pairs(args.pairs),
        split_s=args.split_seconds,
        alone_s=args.alone_seconds,
        neighbour_s=args.neighbour_seconds,
        inference_share=parse_fraction(args.inference_share, "--inference-share"),
        caps_share=parse_fraction(args.caps_share, "--caps-share")
        if args.caps_share is not None
        else min(0.25, math.floor(100 / args.concurrent) / 100),
        starts=args.starts,
        concurrent=args.concurrent,
        kill_every_s=args.kill_every,
        caps_limit_s=args.caps_seconds,
    )
    sys.stderr.write((settings.out / "report.md").read_text())
    return 1 if any("error" in body for body in results.values()) else 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="folder for report.json, report.md, report.png and the runs")
    p.add_argument("--model", default="resnet50", help="convnet, resnet18, resnet50, vgg16 or vgg19 (default resnet50)")
    p.add_argument("--image-size", type=int, default=224, help="square input size in pixels (default 224)")
    p.add_argument("--batch-size", type=int, default=64, help="images per step per worker (default 64)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per worker (default 50)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before them (default 10)")
    data = p.add_mutually_exclusive_group()
    data.add_argument(
        "--synthetic", action="store_true", help="random batches made on the device: model speed alone (default)"
    )
    data.add_argument("--data", metavar="DIR", help="class-folder data set decoded by the trainer's loaders")
    p.add_argument("--workers", type=int, help="DataLoader workers per process with --data (default: the trainer's)")
    p.add_argument("--classes", type=int, default=1000, help="classes of the synthetic data (default 1000)")
    p.add_argument("--device", default="auto", help="auto (a GPU when the job has one), cpu or cuda")
    p.add_argument("--no-amp", action="store_true", help="no bf16/fp16 autocast on GPU")
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="channels_last memory format (default: on GPU only)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model (compiled during the warm-up)")
    p.add_argument("--ttl", type=float, default=30.0, help="lease TTL in seconds (default 30)")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar per run (default: when stderr is a terminal)",
    )
    p.add_argument("--json", action="store_true", help="print report.json on stdout")
    add_pool_arguments(p)


def _bench(args: argparse.Namespace) -> int:
    from ..core.errors import InvalidInput
    from ..core.quantity import parse_fraction

    try:
        import torch  # noqa: F401  # the workers need it; say so before any job starts

        from ..train.config import MODEL_NAMES
    except ImportError as err:
        raise InvalidInput(f"`gpupool bench` needs the train extra ({err}); pip install 'gpupool[train]'") from None
    from ..bench.driver import Bench, Interrupted, PoolChoice
    from ..bench.plan import Kind, Settings, parse_counts, parse_fractions, scaling_runs, share_runs

    if args.model not in MODEL_NAMES:
        raise InvalidInput(f"--model {args.model!r} is unknown: use one of {', '.join(MODEL_NAMES)}")
    for flag, value, minimum in (
        ("--image-size", args.image_size, 1),
        ("--batch-size", args.batch_size, 1),
        ("--steps", args.steps, 1),
        ("--warmup", args.warmup, 0),
        ("--classes", args.classes, 2),
    ):
        if value < minimum:
            raise InvalidInput(f"{flag} {value} must be >= {minimum}")
    if args.data is not None and not Path(args.data).is_dir():
        raise InvalidInput(f"--data {args.data!r} is not a folder: give a class-folder data set DIR/<class>/*.jpg")
    settings = Settings(
        model=args.model,
        image_size=args.image_size,
        batch_size=args.batch_size,
        steps=args.steps,
        warmup=args.warmup,
        data=str(Path(args.data).resolve()) if args.data else None,
        loader_workers=args.workers,
        classes=args.classes,
        device=args.device,
        amp=not args.no_amp,
        channels_last=args.channels_last,
        compile=args.compile,
    )
    if args.bench_command == "scaling":
        kind = Kind.SCALING
        runs = scaling_runs(parse_counts(args.gpus), parse_fraction(args.fraction, "--fraction"))
    else:
        kind = Kind.SHARE
        runs = share_runs(parse_fractions(args.fractions), args.gpu_index)
    if args.devices:
        os.environ["GPUPOOL_DEVICES"] = args.devices  # the supervisors inherit it, as with submit
    pool = PoolChoice(
        servers=tuple(args.server or ()),
        state_dir=Path(args.state).expanduser() if args.state else None,
        ttl_s=args.ttl,
    )
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    bench = Bench(kind, settings, runs, Path(args.out), pool, progress=progress)
    try:
        report = bench.run()
    except Interrupted as stop:
        where = f"; partial report: {stop.report['markdown']}" if stop.report else ""
        print(f"gpupool: interrupted: every benchmark job was cancelled{where}", file=sys.stderr)
        return stop.exit_code
    files = report["files"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        sys.stderr.write("\n" + Path(files["markdown"]).read_text())
    print(f"report: {files['json']} {files['markdown']} {files['plot']}", file=sys.stderr)
    failed = [r["label"] for r in report["runs"] if "error" in r]
    return 1 if failed else 0
