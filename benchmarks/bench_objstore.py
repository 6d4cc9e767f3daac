"""Object-storage benchmark (issue 26): training images/second through the trainer's DataLoader
from a bucket, read through the local cache once it holds the data set, against the same files on
local disk, in one run. Target: ratio >= 0.8.

The bucket is moto's S3 server, started here on a loopback port in its own process (so it never
competes with the measuring process for the interpreter lock); the files are ImageNet-like JPEGs
(bench_input_pipeline.make_jpegs). Each side is `gpupool.train.data.ImageFiles` in a DataLoader
with persistent workers as in training: the local side over a folder, the bucket side over
`BucketFiles` (s3://bench/data). Per round: the bucket side's first pass (a fresh cache: every
image fetched) is timed as the cold figure, its second pass (all cached) as the cached figure, and
the local side's second pass likewise; sides alternate and the best round counts (other load on a
shared machine only ever slows a round down).

Writes benchmarks/results/objstore.json (or --out) and prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from bench_input_pipeline import make_jpegs  # noqa: E402
from results_file import load_average, write_and_show  # noqa: E402  (beside this script)

from gpupool.train import storage  # noqa: E402
from gpupool.train.bucket_data import BucketFiles  # noqa: E402
from gpupool.train.data import ImageFiles, make_loader  # noqa: E402


def start_s3() -> Tuple[subprocess.Popen, Dict[str, str]]:
    """moto's S3 server on a free loopback port, and the env that points s3fs at it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit("moto's S3 server did not start; pip install 'moto[server]'") from None
            time.sleep(0.2)
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return proc, env


def passes(root: Any, samples: List[Tuple[str, int]], size: int, batch: int, workers: int) -> Tuple[float, float]:
    """(images/s of the first pass, images/s of the second) through one persistent loader."""
    from gpupool.train.data import close_loaders

    ds = ImageFiles(root, samples, size)
    loader, _ = make_loader(
        ds, batch, workers, pin_memory=False, shuffle=False, seed=0, rank=0, world_size=1, persistent=True
    )
    rates = []
    for _ in range(2):
        n, t0 = 0, time.perf_counter()
        for images, labels, _ in loader:
            n += images.shape[0]
            assert int((labels < 0).sum()) == 0, "an image failed to read"
        rates.append(n / (time.perf_counter() - t0))
    close_loaders(loader)
    return rates[0], rates[1]


def main() -> int:
    """Upload, run both sides, write the JSON result."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=600)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--size", type=int, default=224, help="resize target (square)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "objstore.json")
    args = p.parse_args()
    torch.set_num_threads(1)

    server, env = start_s3()
    os.environ.update(env)
    local: List[float] = []
    cold: List[float] = []
    cached: List[float] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "data"
            samples = make_jpegs(folder, args.images, args.width, args.height)
            import fsspec

            fsspec.filesystem("s3").mkdir("bench")
            t0 = time.perf_counter()
            storage.put_tree(folder, "s3://bench/data")
            upload_s = time.perf_counter() - t0
            data_bytes = sum(f.stat().st_size for f in folder.rglob("*.jpg"))
            for r in range(args.rounds):
                cache_dir = Path(tmp) / f"cache-{r}"  # a fresh cache: the first pass fetches everything
                bucket = BucketFiles("s3://bench/data", cache_dir, max_bytes=4 * data_bytes)
                listed = bucket.scan()[1]
                assert sorted(listed) == sorted(samples), "the listing differs from the upload"
                first, second = passes(bucket, samples, args.size, args.batch_size, args.workers)
                cold.append(first)
                cached.append(second)
                local.append(passes(folder, samples, args.size, args.batch_size, args.workers)[1])
                shutil.rmtree(cache_dir, ignore_errors=True)
                print(
                    f"round {r + 1}: local {local[-1]:.1f} img/s, bucket cold {cold[-1]:.1f} img/s, "
                    f"bucket cached {cached[-1]:.1f} img/s",
                    file=sys.stderr,
                )
    finally:
        server.kill()
        server.wait()

    result: Dict[str, Any] = {
        "benchmark": "objstore",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "settings": {
            "images": args.images,
            "bytes": data_bytes,
            "source": f"{args.width}x{args.height} JPEG q90",
            "resize": args.size,
            "batch_size": args.batch_size,
            "workers": args.workers,
            "rounds": args.rounds,
            "bucket": "moto S3 server on loopback (its own process), s3fs",
        },
        "local_images_per_second": round(max(local), 1),
        "bucket_cached_images_per_second": round(max(cached), 1),
        "bucket_cold_images_per_second": round(max(cold), 1),
        "ratio": round(max(cached) / max(local), 3),
        "target_ratio": 0.8,
        "cold_ratio": round(max(cold) / max(local), 3),
        "upload_seconds": round(upload_s, 2),
        "load_average_at_end": load_average(),
        "rounds": {
            "local": [round(x, 1) for x in local],
            "bucket_cold": [round(x, 1) for x in cold],
            "bucket_cached": [round(x, 1) for x in cached],
        },
    }
    write_and_show(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
