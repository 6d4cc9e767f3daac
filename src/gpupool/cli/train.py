"""`gpupool train`: the reference image classifier (transfer learning, DDP under torchrun)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict

# Flag name -> TrainConfig field, for the options a preset may set (None = not given).
_OVERRIDES = (
    "model",
    "weights",
    "train_last",
    "head",
    "hidden",
    "dropout",
    "image_size",
    "epochs",
    "batch_size",
    "lr",
    "weight_decay",
    "schedule",
    "patience",
    "workers",
    "seed",
    "device",
    "max_steps_per_epoch",
    "cache_dir",
    "keep_checkpoints",
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `train`."""
    p = subparsers.add_parser(
        "train",
        help="train an image classifier on DIR/<class>/*.jpg",
        description="Train an image classifier on a class-folder data set. Runs on one GPU, a CPU, or as one "
        "of WORLD_SIZE data-parallel workers (RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as "
        "torchrun sets them). Resumes from OUT/checkpoint.pt when there is one. DATA and OUT may be "
        "s3://, gs://, az:// or file:// URLs (the objstore extra): the data set is read through a local cache, "
        "checkpoints go to OUT/checkpoints/ and the run resumes from the newest one on any machine.",
    )
    p.add_argument(
        "--data", required=True, help="class-folder data set: DATA/<class>/*.{jpg,jpeg,png}, a folder or a bucket URL"
    )
    p.add_argument(
        "--out",
        help="run folder or bucket URL: split, checkpoints, metrics, report, model (default: $GPUPOOL_CHECKPOINTS, "
        "which a job spec's checkpoints: sets in every replica)",
    )
    p.add_argument("--preset", help="a named recipe, e.g. vgg19-transfer (flags still override it)")
    p.add_argument("--model", help="convnet, resnet18, resnet50, vgg16 or vgg19 (default resnet18)")
    p.add_argument("--weights", help="pretrained torchvision weights file (.pth), or 'none' to train from scratch")
    p.add_argument(
        "--train-last",
        help="backbone layers left trainable: a number or 'all' (default: 0 with pretrained weights, all without)",
    )
    p.add_argument("--head", choices=("linear", "mlp"), help="new classifier head (mlp: Dense hidden ReLU Dense)")
    p.add_argument("--hidden", type=int, help="units of the mlp head's hidden layer (default 30)")
    p.add_argument("--dropout", type=float, help="dropout before the head (default 0)")
    p.add_argument("--image-size", type=int, help="square input size in pixels (default 224)")
    p.add_argument("--epochs", type=int, help="most epochs to run (default 30)")
    p.add_argument("--batch-size", type=int, help="images per step per worker (default 64)")
    p.add_argument("--lr", type=float, help="Adam learning rate (default 1e-3)")
    p.add_argument("--weight-decay", type=float, help="Adam weight decay (default 0)")
    p.add_argument("--schedule", choices=("constant", "cosine"), help="learning-rate schedule (default constant)")
    p.add_argument("--patience", type=int, help="early stopping: epochs without val_loss improvement (default 5)")
    p.add_argument("--workers", type=int, help="DataLoader worker processes per training process (default: auto)")
    p.add_argument("--seed", type=int, help="seed for the split, initialisation and shuffling (default 0)")
    p.add_argument("--split", default="70/15/15", help="train/val/test percentages (default 70/15/15)")
    p.add_argument("--hflip", action="store_true", help="random horizontal flips while training")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (pays off on long GPU runs)")
    p.add_argument("--no-amp", action="store_true", help="no mixed precision on GPU")
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="channels_last memory format (default: on GPU only)",
    )
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda:LOCAL_RANK if there is a GPU)")
    p.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="continue from OUT/checkpoint.pt when it exists (default on)",
    )
    p.add_argument(
        "--cache-dir",
        help="local cache for bucket data sets and runs (default $GPUPOOL_CACHE_DIR or ~/.cache/gpupool)",
    )
    p.add_argument("--cache-size", help="most the data cache holds, e.g. 20Gi (default 20Gi); least recently read goes")
    p.add_argument("--keep-checkpoints", type=int, help="checkpoints a bucket run keeps, newest first (default 3)")
    p.add_argument("--max-steps-per-epoch", type=int, help="cut epochs short (smoke tests, benchmarks)")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout (rank 0)")
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    import os

    from gpupool.core.errors import InvalidInput
    from gpupool.core.quantity import parse_memory_mib
    from gpupool.train.config import CHECKPOINTS_ENV, build_config, parse_split

    overrides: Dict[str, Any] = {name: getattr(args, name) for name in _OVERRIDES}
    out = args.out or os.environ.get(CHECKPOINTS_ENV)
    if not out:
        raise InvalidInput(
            f"give --out DIR or a bucket URL (or set {CHECKPOINTS_ENV}, as a job spec's checkpoints: does)"
        )
    if args.cache_size is not None:
        overrides["cache_size"] = parse_memory_mib(args.cache_size, "--cache-size") << 20
    try:
        overrides["split"] = parse_split(args.split)
        cfg = build_config(
            args.data,
            out,
            preset=args.preset,
            overrides={
                **overrides,
                "hflip": args.hflip or None,
                "compile": args.compile or None,
                "amp": False if args.no_amp else None,
                "channels_last": args.channels_last,
                "resume": args.resume,
                "progress": args.progress,
            },
        )
    except ValueError as err:
        raise InvalidInput(str(err)) from None
    try:
        from gpupool.train.trainer import train
    except ImportError as err:
        raise InvalidInput(f"`gpupool train` needs the train extra ({err}); pip install 'gpupool[train]'") from None

    result = train(cfg)
    if int(os.environ.get("RANK", "0") or 0) == 0:
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(
                f"test_accuracy={result['test_accuracy']:.4f} images_per_second={result['images_per_second']:.1f} "
                f"epochs_run={result['epochs_run']} report={cfg.out.rstrip('/')}/report.json",
                flush=True,
            )
    return 0
