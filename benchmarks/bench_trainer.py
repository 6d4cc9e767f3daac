"""Trainer benchmark: `gpupool train` images/second against a minimal hand-written PyTorch
loop on the same model, data, batch size and loader workers, in one run; plus model-only
throughput on synthetic data already on the device.

Both sides train on the same training split (the trainer's split.json) and both are timed
the same way: steady state, i.e. epochs after the first, each epoch timed from the end of
its first step. The trainer's validation passes are outside that window, as they are
outside the hand loop. Rounds alternate trainer and hand loop, and which of the two goes
first (ABBA), so that drift of a shared machine hits both sides alike. Two figures:
`ratio` compares the best epoch of each side; `median_ratio` is the median over rounds of
the paired ratio (trainer median epoch / hand-loop median epoch of the same round), which
cancels load that lasts longer than a round. `pooled_median_ratio` (median of all trainer
epochs / median of all hand epochs, unpaired) was the earlier definition and is kept for
comparison. Target: ratio >= 0.97.

Defaults are small enough for a 2-core CPU (digits at 32 px, the ConvNet). On a GPU:

    python benchmarks/bench_trainer.py --device cuda --model resnet50 --weights none \
        --image-size 224 --batch-size 256 --workers 8 --jpegs 20000 --rounds 1 \
        --out benchmarks/results/trainer_resnet50_cuda.json

(--data DIR uses a real class-folder data set instead of generated JPEGs; on CUDA both
sides use bf16 autocast and channels_last.)

Writes benchmarks/results/trainer.json (or --out) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from results_file import load_average, write_and_show  # noqa: E402  (beside this script)
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from gpupool.train.config import build_config  # noqa: E402
from gpupool.train.data import MEAN, STD, Split, decode_resized  # noqa: E402
from gpupool.train.networks import build_model  # noqa: E402
from gpupool.train.trainer import train  # noqa: E402


class PlainFiles(Dataset):
    """What a hand-written loop would do: read, decode, resize, normalise, in the worker."""

    def __init__(self, root: Path, samples: List[Tuple[str, int]], size: int) -> None:
        self.items = [(str(root / p), c) for p, c in samples]
        self.size = size
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with open(path, "rb") as f:
            img = decode_resized(f.read(), self.size)
        return (img.float() / 255.0 - self.mean) / self.std, label


def hand_loop(args: argparse.Namespace, data: Path, split: Split, device: torch.device) -> List[float]:
    """Minimal loop: DataLoader, forward, cross-entropy, backward, Adam step."""
    torch.manual_seed(0)
    model = build_model(args.model, len(split.classes), args.image_size, weights=args.weights).to(device)
    amp = device.type == "cuda"
    if amp:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(
        [p for p in model.parameters() if p.requires_grad], lr=1e-3, **({"fused": True} if amp else {})
    )
    loader = DataLoader(
        PlainFiles(data, list(split.train), args.image_size),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=amp,
        persistent_workers=args.workers > 0,
    )
    model.train()
    rates: List[float] = []
    for epoch in range(args.epochs):
        t0 = None
        n = 0
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if amp:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x).float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step == 0:
                if amp:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            else:
                n += x.shape[0]
        if amp:
            torch.cuda.synchronize()
        if epoch > 0 and t0 is not None:  # epoch 0 is warm-up, as in the trainer's report
            rates.append(n / (time.perf_counter() - t0))
    return rates


def trainer_run(args: argparse.Namespace, data: Path, out: Path) -> Tuple[List[float], Split]:
    """`gpupool train` in-process, fresh run dir; returns the steady throughput of each
    epoch after the first, as the trainer itself measured and logged it."""
    cfg = build_config(
        str(data),
        str(out),
        overrides={
            "model": args.model,
            "weights": args.weights,
            "image_size": args.image_size,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "workers": args.workers,
            "patience": 1000,
            "resume": False,
            "device": args.device,
            "progress": False,
            "split": (0.7, 0.15, 0.15),
        },
    )
    train(cfg)
    split = Split.from_json(json.loads((out / "split.json").read_text()))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["steady_images"] / r["steady_seconds"] for r in rows[1:]], split


def synthetic(args: argparse.Namespace, device: torch.device, num_classes: int) -> float:
    """Model-only throughput: random uint8 batch already on the device, trainer settings."""
    torch.manual_seed(0)
    model = build_model(args.model, num_classes, args.image_size, weights=args.weights).to(device)
    amp = device.type == "cuda"
    if amp:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    if amp:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, num_classes, (args.batch_size,), device=device)
    steps = args.synthetic_steps
    for i in range(steps + 3):
        if i == 3:
            if amp:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if amp:
        torch.cuda.synchronize()
    return steps * args.batch_size / (time.perf_counter() - t0)


def bench_data(args: argparse.Namespace, tmp: Path) -> Path:
    """The data set of a trainer benchmark: --data, else --jpegs generated JPEGs, else digits, under `tmp`."""
    if args.data is not None:
        return Path(args.data)
    if args.jpegs:
        from bench_input_pipeline import make_jpegs  # ImageNet-like 500x375 JPEGs

        make_jpegs(tmp / "jpegs", args.jpegs, 500, 375, classes=10)
        return tmp / "jpegs"
    from gpupool.train.digits import export_digits

    export_digits(tmp / "digits")
    return tmp / "digits"


def machine(device: torch.device) -> Dict[str, Any]:
    """Where a trainer benchmark ran (saved with its figures)."""
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
    }


def settings(args: argparse.Namespace) -> Dict[str, Any]:
    """The data, model and loop settings of a trainer benchmark (saved with its figures)."""
    generated = f"{args.jpegs} generated 500x375 JPEGs" if args.jpegs else "sklearn digits (PNG)"
    return {
        "data": str(args.data) if args.data else generated,
        "model": args.model,
        "image_size": args.image_size,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "workers": args.workers,
        "rounds": args.rounds,
    }


def main() -> int:
    """Run the comparison and write the JSON result."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="class-folder data set (default: scikit-learn digits, exported)")
    p.add_argument(
        "--jpegs",
        type=int,
        default=0,
        help="generate N ImageNet-like 500x375 JPEGs in 10 classes as the data (default: digits)",
    )
    p.add_argument("--model", default="convnet")
    p.add_argument("--weights", default="none")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3, help="per measurement; the first is warm-up")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (both sides)")
    p.add_argument("--rounds", type=int, default=6, help="alternating trainer/hand-loop rounds (ABBA order)")
    p.add_argument("--synthetic-steps", type=int, default=30)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "trainer.json")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)

    with tempfile.TemporaryDirectory() as tmp:
        data = bench_data(args, Path(tmp))
        trainer_rates: List[float] = []
        hand_rates: List[float] = []
        round_ratios: List[float] = []
        # The hand loop trains on the trainer's split, so a trainer run comes first once.
        _, split = trainer_run(args, data, Path(tmp) / "split")
        for r in range(args.rounds):
            if r % 2 == 0:
                rates, _ = trainer_run(args, data, Path(tmp) / f"run{r}")
                hand = hand_loop(args, data, split, device)
            else:
                hand = hand_loop(args, data, split, device)
                rates, _ = trainer_run(args, data, Path(tmp) / f"run{r}")
            trainer_rates += rates
            hand_rates += hand
            round_ratios.append(statistics.median(rates) / statistics.median(hand))
            print(
                f"round {r + 1}: trainer {max(rates):.1f} img/s, hand loop {max(hand):.1f} img/s, "
                f"paired median ratio {round_ratios[-1]:.3f}",
                file=sys.stderr,
            )
        synth = synthetic(args, device, len(split.classes))

    # Best epoch of each side: on a shared machine, other load only ever slows an epoch
    # down, so the fastest epoch is the closest to the code's own speed. Medians are kept too.
    trainer_ips, hand_ips = max(trainer_rates), max(hand_rates)
    result: Dict[str, Any] = {
        "benchmark": "trainer_overhead",
        "machine": machine(device),
        "settings": dict(settings(args), amp="bf16 + channels_last" if device.type == "cuda" else "none (fp32)"),
        "trainer_images_per_second": round(trainer_ips, 1),
        "hand_loop_images_per_second": round(hand_ips, 1),
        "ratio": round(trainer_ips / hand_ips, 3),
        "target_ratio": 0.97,
        "median_ratio": round(statistics.median(round_ratios), 3),
        "pooled_median_ratio": round(statistics.median(trainer_rates) / statistics.median(hand_rates), 3),
        "round_ratios": [round(x, 3) for x in round_ratios],
        "load_average_at_end": load_average(),
        "epochs": {"trainer": [round(x, 1) for x in trainer_rates], "hand_loop": [round(x, 1) for x in hand_rates]},
        "synthetic_images_per_second": round(synth, 1),
    }
    write_and_show(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
