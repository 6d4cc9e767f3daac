"""Trainer against PyTorch Lightning: `gpupool train` images/second against a LightningModule
on the same model, data, batch size, optimizer and loader workers, in one run.

Lightning is what many users would pick instead of a reference trainer, so its side is what
such a user writes: the same `build_model` network in a LightningModule (cross-entropy, Adam
1e-3), a plain Dataset that reads, decodes, resizes and normalises in the loader workers
(`bench_trainer.PlainFiles`, the hand-written loop's), and `lightning.Trainer` with logging,
checkpointing, progress bar, model summary and validation off, bf16-mixed precision and
channels_last on CUDA, 32-bit on CPU. Both sides train on the trainer's training split and are
timed the same way: epochs after the first, each from the end of its first step to the end of
the epoch (the trainer logs this itself; a Lightning callback does the same there). Rounds
alternate the two sides in ABBA order, and `median_ratio` is the median over rounds of the
paired ratio (trainer median epoch / Lightning median epoch of the same round), which cancels
load on a shared machine that lasts longer than a round; `ratio` compares the best epochs.
On a CPU each side runs one thread (`--threads`), and `cpu_time_median_ratio` is the same
paired ratio of images per CPU second of each training epoch (the trainer's `train_epoch`,
Lightning's epoch from its start hook to its end hook): other load on a shared machine
stretches wall time but hardly the CPU time a side spends, so this is the steadier figure there.

Skipped, with a message and exit code 0, when Lightning is not installed
(`pip install lightning`). On a GPU:

    python benchmarks/bench_lightning.py --device cuda --model resnet50 --image-size 224 \
        --batch-size 256 --workers 8 --jpegs 20000 --rounds 2 \
        --out benchmarks/results/lightning_resnet50_cuda.json

Writes benchmarks/results/lightning.json (or --out) and prints it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))
sys.path.insert(0, str(ROOT))

try:
    import lightning as L
except ImportError:
    L = None

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_trainer import PlainFiles, bench_data, machine, settings, trainer_run  # noqa: E402
from results_file import load_average, write_and_show  # noqa: E402  (beside this script)
from torch.utils.data import DataLoader  # noqa: E402

from gpupool.train.data import Split  # noqa: E402
from gpupool.train.networks import build_model  # noqa: E402


def lightning_run(
    args: argparse.Namespace, data: Path, split: Split, device: torch.device
) -> Tuple[List[float], List[float]]:
    """Train with Lightning; returns the steady images/second of each epoch after the first,
    by wall time and by CPU time."""
    assert L is not None
    cuda = device.type == "cuda"

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build_model(args.model, len(split.classes), args.image_size, weights=args.weights)
            if cuda:
                self.model = self.model.to(memory_format=torch.channels_last)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            if cuda:
                x = x.contiguous(memory_format=torch.channels_last)
            return F.cross_entropy(self(x).float(), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            params = [p for p in self.parameters() if p.requires_grad]
            return torch.optim.Adam(params, lr=1e-3, **({"fused": True} if cuda else {}))

    class SteadyClock(L.Callback):
        """Each epoch timed from the end of its first step, as the trainer times its own."""

        def __init__(self) -> None:
            self.rates: List[float] = []
            self.cpu_rates: List[float] = []
            self.t0 = self.cpu0 = 0.0
            self.images = self.all_images = 0

        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            self.cpu0, self.all_images = time.process_time(), 0

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.all_images += int(batch[0].shape[0])
            if batch_idx == 0:
                if cuda:
                    torch.cuda.synchronize()
                self.t0, self.images = time.perf_counter(), 0
            else:
                self.images += int(batch[0].shape[0])

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            if self.images:
                self.rates.append(self.images / (time.perf_counter() - self.t0))
                self.cpu_rates.append(self.all_images / (time.process_time() - self.cpu0))

    torch.manual_seed(0)
    loader = DataLoader(
        PlainFiles(data, list(split.train), args.image_size),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=cuda,
        persistent_workers=args.workers > 0,
    )
    clock = SteadyClock()
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        max_epochs=args.epochs,
        precision="bf16-mixed" if cuda else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[clock],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no validation loop", "few workers": chosen here
        trainer.fit(Module(), loader)
    return clock.rates[1:], clock.cpu_rates[1:]  # the first epoch is warm-up, as in the trainer's report


class TrainerCpuClock:
    """CPU time of each of the trainer's training epochs (`train_epoch`, the same span as
    Lightning's fit loop epoch): a figure that other load on a shared machine barely moves,
    unlike wall time, as long as each side runs one thread."""

    def __init__(self) -> None:
        import gpupool.train.trainer as trainer_module

        self.module = trainer_module
        self.original = trainer_module.train_epoch
        self.rates: List[float] = []

        def timed(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            result = self.original(*args, **kwargs)
            self.rates.append(result.images / (time.process_time() - c0))
            return result

        trainer_module.train_epoch = timed

    def take(self) -> List[float]:
        """The epochs since the last call, less the first (warm-up)."""
        rates, self.rates = self.rates[1:], []
        return rates


def main() -> int:
    """Run the comparison and write the JSON result."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="class-folder data set (default: scikit-learn digits, exported)")
    p.add_argument("--jpegs", type=int, default=0, help="generate N ImageNet-like 500x375 JPEGs in 10 classes")
    p.add_argument("--model", default="convnet")
    p.add_argument("--weights", default="none")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3, help="per measurement; the first is warm-up")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (both sides)")
    p.add_argument("--rounds", type=int, default=6, help="alternating trainer/Lightning rounds (ABBA order)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of each side on CPU (default 1)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "lightning.json")
    args = p.parse_args()
    if L is None:
        print("bench_lightning: skipped: PyTorch Lightning is not installed (pip install lightning)", file=sys.stderr)
        return 0
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no GPU/TPU banner per run
    device = torch.device(args.device)
    if device.type == "cpu":
        # One thread per side: CPU time then counts work, not threads spinning at a barrier
        # while another process holds the core (the trainer reads OMP_NUM_THREADS too).
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    # bench_trainer's functions read these (its own flags); same meaning here.
    args.synthetic_steps = 0

    with tempfile.TemporaryDirectory() as tmp:
        data = bench_data(args, Path(tmp))
        trainer_rates: List[float] = []
        lightning_rates: List[float] = []
        round_ratios: List[float] = []
        cpu_ratios: List[float] = []
        cpu = TrainerCpuClock()
        _, split = trainer_run(args, data, Path(tmp) / "split")  # Lightning trains on this split
        cpu.take()
        for r in range(args.rounds):
            if r % 2 == 0:
                rates, _ = trainer_run(args, data, Path(tmp) / f"run{r}")
                other, other_cpu = lightning_run(args, data, split, device)
            else:
                other, other_cpu = lightning_run(args, data, split, device)
                rates, _ = trainer_run(args, data, Path(tmp) / f"run{r}")
            rates_cpu = cpu.take()
            trainer_rates += rates
            lightning_rates += other
            round_ratios.append(statistics.median(rates) / statistics.median(other))
            cpu_ratios.append(statistics.median(rates_cpu) / statistics.median(other_cpu))
            print(
                f"round {r + 1}: trainer {max(rates):.1f} img/s, Lightning {max(other):.1f} img/s, "
                f"paired median ratio {round_ratios[-1]:.3f}; per CPU second {cpu_ratios[-1]:.3f}",
                file=sys.stderr,
            )

    trainer_ips, lightning_ips = max(trainer_rates), max(lightning_rates)
    result: Dict[str, Any] = {
        "benchmark": "trainer_vs_lightning",
        "machine": dict(machine(device), lightning=L.__version__),
        "settings": dict(
            settings(args),
            precision="bf16-mixed + channels_last" if device.type == "cuda" else "fp32",
            threads=args.threads if device.type == "cpu" else None,
        ),
        "trainer_images_per_second": round(trainer_ips, 1),
        "lightning_images_per_second": round(lightning_ips, 1),
        "ratio": round(trainer_ips / lightning_ips, 3),
        "median_ratio": round(statistics.median(round_ratios), 3),
        "round_ratios": [round(x, 3) for x in round_ratios],
        "cpu_time_median_ratio": round(statistics.median(cpu_ratios), 3) if device.type == "cpu" else None,
        "cpu_time_round_ratios": [round(x, 3) for x in cpu_ratios] if device.type == "cpu" else None,
        "load_average_at_end": load_average(),
        "epochs": {
            "trainer": [round(x, 1) for x in trainer_rates],
            "lightning": [round(x, 1) for x in lightning_rates],
        },
    }
    write_and_show(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
