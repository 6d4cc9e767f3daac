"""Input-pipeline benchmark: JPEG images/second through the trainer's DataLoader, per worker,
against raw torchvision.io.decode_jpeg + resize on the same files in a plain loop.

The files are ImageNet-like JPEGs (default 500x375, quality 90) written once to a temp
folder and read through the page cache on both sides. The trainer side is
`gpupool.train.data.ImageFiles` in a DataLoader with one worker (so the figure is per
worker), persistent as in training, timed over its second pass (worker start-up and
imports excluded); the raw side
is read + decode_jpeg + resize(antialias) in the main process. Both sides produce the same
3 x size x size uint8 images with the same resize op; the loader's batches are
N x 3 x size x size uint8 in channels_last memory, the interleaved layout the decoder and
resize already produce (the raw side's outputs have the same strides). Each side runs --rounds
times, alternating, and the best round counts (other load on a shared machine only ever
slows a round down). Target: ratio >= 0.9.

Writes benchmarks/results/input_pipeline.json (or --out) and prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))

import torch  # noqa: E402
from results_file import load_average, write_and_show  # noqa: E402  (beside this script)

from gpupool.train.data import ImageFiles, make_loader  # noqa: E402


def make_jpegs(folder: Path, count: int, width: int, height: int, classes: int = 2) -> List[Tuple[str, int]]:
    """Smooth gradients plus noise: decodes like a photo, not like flat colour or pure noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width]
    samples = []
    for i in range(count):
        cls = i % classes
        (folder / str(cls)).mkdir(parents=True, exist_ok=True)
        base = np.stack([(xx * (i + 1) % 256), (yy * 3 + i * 7) % 256, ((xx + yy) // 2 + i) % 256], axis=-1)
        img = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        rel = f"{cls}/{i:05d}.jpg"
        Image.fromarray(img).save(folder / rel, quality=90)
        samples.append((rel, cls))
    return samples


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc), or NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def raw_rate(folder: Path, samples: List[Tuple[str, int]], size: int) -> Tuple[float, float]:
    """read_file + decode_jpeg + resize, nothing else, in this process.
    Returns (images per wall second, images per CPU second)."""
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms.v2.functional import resize

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0, c0 = time.perf_counter(), time.process_time()
        for rel, _ in samples:
            img = decode_jpeg(read_file(str(folder / rel)))
            resize(img, [size, size], antialias=True)
        return len(samples) / (time.perf_counter() - t0), len(samples) / (time.process_time() - c0)


def loader_rate(
    folder: Path, samples: List[Tuple[str, int]], size: int, batch: int, workers: int
) -> Tuple[float, float]:
    """The trainer's dataset and loader (uint8 out, skip-and-count wrapper included), with
    persistent workers as the trainer uses them: the first pass starts the workers and is
    not timed, the second pass is. Returns (images per wall second, images per CPU second
    of the workers), both per worker."""
    ds = ImageFiles(folder, samples, size)
    loader, _ = make_loader(
        ds, batch, workers, pin_memory=False, shuffle=False, seed=0, rank=0, world_size=1, persistent=True
    )
    for _ in loader:
        pass
    try:  # private attribute, for the CPU-time figure only
        pids = [w.pid for w in loader._iterator._workers]  # type: ignore[attr-defined]
    except AttributeError:
        pids = []
    c0 = sum(_cpu_seconds(pid) for pid in pids)
    n, t0 = 0, time.perf_counter()
    for images, _, _ in loader:
        n += images.shape[0]
    wall = time.perf_counter() - t0
    cpu = sum(_cpu_seconds(pid) for pid in pids) - c0 if pids else float("nan")
    return n / wall / max(1, workers), n / cpu if cpu > 0 else float("nan")


def main() -> int:
    """Run both sides and write the JSON result."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--size", type=int, default=224, help="resize target (square)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=1, help="loader workers; the result is divided by this")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "input_pipeline.json")
    args = p.parse_args()
    # One decoding thread per side, so "per worker" means one core's worth on both.
    torch.set_num_threads(1)

    raw: List[float] = []
    ours: List[float] = []
    raw_cpu: List[float] = []
    ours_cpu: List[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        samples = make_jpegs(folder, args.images, args.width, args.height)
        raw_rate(folder, samples[:20], args.size)  # warm the page cache and the decoder
        for r in range(args.rounds):
            wall, cpu = raw_rate(folder, samples, args.size)
            raw.append(wall)
            raw_cpu.append(cpu)
            wall, cpu = loader_rate(folder, samples, args.size, args.batch_size, args.workers)
            ours.append(wall)
            ours_cpu.append(cpu)
            print(
                f"round {r + 1}: raw {raw[-1]:.1f} img/s ({raw_cpu[-1]:.1f}/CPU s), "
                f"loader {ours[-1]:.1f} img/s/worker ({ours_cpu[-1]:.1f}/CPU s)",
                file=sys.stderr,
            )

    result: Dict[str, Any] = {
        "benchmark": "input_pipeline",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "settings": {
            "images": args.images,
            "source": f"{args.width}x{args.height} JPEG q90",
            "resize": args.size,
            "batch_size": args.batch_size,
            "workers": args.workers,
            "rounds": args.rounds,
        },
        "raw_decode_resize_images_per_second": round(max(raw), 1),
        "loader_images_per_second_per_worker": round(max(ours), 1),
        "ratio": round(max(ours) / max(raw), 3),
        "target_ratio": 0.9,
        "median_ratio": round(statistics.median(ours) / statistics.median(raw), 3),
        # Images per CPU-second of the decoding process(es): what one core buys on each side,
        # insensitive to other load on a shared machine.
        "raw_images_per_cpu_second": round(max(raw_cpu), 1),
        "loader_images_per_worker_cpu_second": round(max(ours_cpu), 1),
        "cpu_ratio": round(max(ours_cpu) / max(raw_cpu), 3),
        "load_average_at_end": load_average(),
        "rounds": {
            "raw": [round(x, 1) for x in raw],
            "loader_per_worker": [round(x, 1) for x in ours],
            "raw_cpu": [round(x, 1) for x in raw_cpu],
            "loader_cpu": [round(x, 1) for x in ours_cpu],
        },
    }
    write_and_show(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
