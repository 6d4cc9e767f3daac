"""The workloads `gpupool bench isolation` runs as leases' commands: `python -m gpupool.bench.isolation.probe KIND`.

- `matmul`: a saturating loop of square bf16 matrix products (fp32 on a CPU); a sample is
  (time, products done so far), taken at a synchronisation about every --sample-s.
- `infer`: an image model at batch 1, one request every --interval-s (no backlog: a late request
  goes at once); a sample is (request start, its latency in seconds).
- `train`: training steps of an image model on synthetic data; a sample is (step end, images so far).

Each probe warms up, writes OUT.ready, runs until STOP exists (or --seconds pass), then writes OUT,
a JSON object with its samples, atomically. Times are `time.monotonic()`, which every process on
the machine reads from the same clock, so the driver can line two probes' samples up.
torch (and torchvision for the image models) are imported here only.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

KINDS = ("matmul", "infer", "train")
# The probes' sizes, defined here once (the harness's Settings and `gpupool bench isolation` take them).
MATMUL_SIZE = 8192
MODEL = "resnet50"
IMAGE_SIZE = 224
TRAIN_BATCH = 64
INTERVAL_S = 0.02
READY_SUFFIX = ".ready"
WARMUP_S = 3.0


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gpupool.bench.isolation.probe", description=__doc__)
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--out", required=True, type=Path, help="the samples file (JSON), written at the end")
    p.add_argument("--stop-file", type=Path, help="stop once this file exists")
    p.add_argument("--seconds", type=float, default=600.0, help="stop after this long at most (default 600)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--size", type=int, default=MATMUL_SIZE, help="matmul: the matrices' side (default %(default)s)")
    p.add_argument("--sample-s", type=float, default=0.05, help="matmul: about this long between samples")
    p.add_argument("--model", default=MODEL, help="infer/train: a torchvision model name (default %(default)s)")
    p.add_argument("--image-size", type=int, default=IMAGE_SIZE, help="infer/train: input side (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=TRAIN_BATCH, help="train: images per step (default %(default)s)")
    p.add_argument(
        "--interval-s", type=float, default=INTERVAL_S, help="infer: s between requests (default %(default)s)"
    )
    return p.parse_args(argv)


class Clock:
    """Until when a probe runs: the stop file, or its time limit."""

    def __init__(self, stop_file: Optional[Path], seconds: float) -> None:
        self.stop_file = stop_file
        self.deadline = time.monotonic() + seconds

    def running(self) -> bool:
        if time.monotonic() >= self.deadline:
            return False
        return self.stop_file is None or not self.stop_file.exists()


def _write_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _warm(step: Callable[[], None], torch: Any, device: Any) -> float:
    """Run `step` for WARMUP_S (cuBLAS/cuDNN set-up, clocks up); the last step's duration."""
    end = time.monotonic() + WARMUP_S
    last = 0.0
    while True:
        t0 = time.monotonic()
        step()
        _sync(torch, device)
        last = time.monotonic() - t0
        if time.monotonic() >= end:
            return last


def matmul(
    args: argparse.Namespace, torch: Any, device: Any, clock: Clock, ready: Callable[[], None]
) -> List[Tuple[float, float]]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(args.size, args.size, device=device, dtype=dtype)
    b = torch.randn(args.size, args.size, device=device, dtype=dtype)

    def product() -> None:
        torch.matmul(a, b)

    one = _warm(product, torch, device)
    # Products per sample, from one product's time alone: a throttled share simply samples less often.
    per_sample = max(1, round(args.sample_s / max(one, 1e-6)))
    ready()
    done = 0
    samples = [(time.monotonic(), 0.0)]
    while clock.running():
        for _ in range(per_sample):
            product()
        _sync(torch, device)
        done += per_sample
        samples.append((time.monotonic(), float(done)))
    return samples


def _model(args: argparse.Namespace, torch: Any, device: Any) -> Any:
    import torchvision

    model = getattr(torchvision.models, args.model)(weights=None)
    return model.to(device, memory_format=torch.channels_last)


def _autocast(torch: Any, device: Any) -> Any:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def infer(
    args: argparse.Namespace, torch: Any, device: Any, clock: Clock, ready: Callable[[], None]
) -> List[Tuple[float, float]]:
    model = _model(args, torch, device).eval()
    x = torch.randn(1, 3, args.image_size, args.image_size, device=device).to(memory_format=torch.channels_last)

    def request() -> None:
        with torch.inference_mode(), _autocast(torch, device):
            model(x)

    _warm(request, torch, device)
    ready()
    samples: List[Tuple[float, float]] = []
    due = time.monotonic()
    while clock.running():
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        t0 = time.monotonic()
        request()
        _sync(torch, device)
        samples.append((t0, time.monotonic() - t0))
        due = max(due + args.interval_s, time.monotonic())
    return samples


def train(
    args: argparse.Namespace, torch: Any, device: Any, clock: Clock, ready: Callable[[], None]
) -> List[Tuple[float, float]]:
    model = _model(args, torch, device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    size = args.image_size
    images = torch.randn(args.batch_size, 3, size, size, device=device).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with _autocast(torch, device):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()

    _warm(step, torch, device)
    ready()
    seen = 0
    samples = [(time.monotonic(), 0.0)]
    while clock.running():
        step()
        _sync(torch, device)
        seen += args.batch_size
        samples.append((time.monotonic(), float(seen)))
    return samples


PROBES = {"matmul": matmul, "infer": infer, "train": train}


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    clock = Clock(args.stop_file, args.seconds)

    def ready() -> None:
        args.out.with_name(args.out.name + READY_SUFFIX).write_text(str(os.getpid()))

    samples = PROBES[args.kind](args, torch, device, clock, ready)
    _write_atomic(
        args.out,
        {
            "kind": args.kind,
            "pid": os.getpid(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            # What the lease's contract set for CUDA (no GPUPOOL_* value: a token may be among them).
            "cuda_env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_")},
            "samples": samples,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
