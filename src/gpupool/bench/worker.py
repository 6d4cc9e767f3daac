"""One benchmark replica: `python -m gpupool.bench.worker --out RUN_DIR --tag T ...`.

Times the trainer's own step (`train.loop.train_step`) on the trainer's model, set up the way
`train.trainer` does — `build_model`, DDP with gradient-as-bucket-view under WORLD_SIZE > 1,
bf16 autocast (fp16 with a scaler where bf16 is missing), channels_last, fused Adam and pinned
loaders on a GPU; foreach Adam and fp32 on a CPU — on synthetic uint8 batches made once on the
device (what the loader would hand over, so the `Normalizer` still runs every step) or on a
class-folder data set through the trainer's `ImageFiles` and `make_loader`. It reads only the
torchrun env, like the trainer.

Phases: `warmup` steps (autotuning, allocator growth, loader start-up: not timed), a start
line shared by `--peers` concurrent jobs (files in RUN_DIR), `steps` timed steps (CUDA events
on a GPU, no per-step sync), then, with peers, untimed steps until every peer has finished
timing, so each job is measured under the same contention. Writes
RUN_DIR/result-TAG-rRANK.json; rank 0 also keeps RUN_DIR/progress-TAG.json current.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

PROGRESS_EVERY_S = 0.5
POLL_S = 0.05


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The worker's flags (the driver builds them with `plan.worker_command`)."""
    p = argparse.ArgumentParser(prog="python -m gpupool.bench.worker", description=__doc__)
    p.add_argument("--out", required=True, help="the run's folder (results, progress, start line)")
    p.add_argument("--tag", required=True, help="this job's name within the run")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--classes", type=int, default=1000, help="classes of the synthetic data")
    p.add_argument("--data", help="class-folder data set (default: synthetic batches on the device)")
    p.add_argument("--loader-workers", type=int, help="DataLoader workers per process (default: the trainer's)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-amp", action="store_true")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (compiled during warm-up)")
    p.add_argument("--peers", type=int, default=1, help="concurrent jobs that start and hold together")
    p.add_argument("--concurrent", type=int, default=1, help="worker processes this run starts in all")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds to wait for the peers")
    return p.parse_args(argv)


def write_json_atomic(data: Any, path: Path) -> None:
    """Readers in the driver never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


class Progress:
    """RUN_DIR/progress-TAG.json: {"phase", "step", "of"}, rewritten at most every 0.5 s."""

    def __init__(self, path: Optional[Path], total: int) -> None:
        self.path = path
        self.total = total
        self.last = 0.0

    def update(self, phase: str, step: int, force: bool = False) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            write_json_atomic({"phase": phase, "step": step, "of": self.total}, self.path)


class StartLine:
    """Concurrent jobs meet here before timing and hold their load until all have timed.

    Markers are files in the run folder (`start-TAG`, `done-TAG`): the jobs are separate
    process trees under separate supervisors, with nothing else in common.
    """

    def __init__(self, run_dir: Path, tag: str, peers: int) -> None:
        self.run_dir, self.tag, self.peers = run_dir, tag, peers

    def _count(self, what: str) -> int:
        return sum(1 for _ in self.run_dir.glob(f"{what}-*"))

    def arrive(self, timeout_s: float) -> None:
        """Mark this job ready and wait for every peer; SystemExit when they never come."""
        (self.run_dir / f"start-{self.tag}").touch()
        end = time.monotonic() + timeout_s
        while self._count("start") < self.peers:
            if time.monotonic() > end:
                raise SystemExit(
                    f"bench worker {self.tag}: only {self._count('start')} of {self.peers} jobs reached the "
                    f"start line in {timeout_s:g}s; see the other jobs' logs (gpupool logs NAME)"
                )
            time.sleep(POLL_S)

    def finish(self) -> None:
        (self.run_dir / f"done-{self.tag}").touch()

    def all_done(self) -> bool:
        return self._count("done") >= self.peers


def main(argv: Optional[List[str]] = None) -> int:
    """Run warm-up, the start line, the timed steps and the hold; write the result."""
    args = parse_args(argv)
    import torch

    from gpupool.core.errors import GpupoolError
    from gpupool.train import distributed
    from gpupool.train.data import Normalizer
    from gpupool.train.loop import Engine, train_step
    from gpupool.train.networks import build_model

    try:
        denv = distributed.read_env()
    except ValueError as err:
        print(f"bench worker: {err}", file=sys.stderr)
        return 2
    device = distributed.pick_device(denv, None if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"bench worker: --device {args.device} but no GPU is visible; use --device cpu", file=sys.stderr)
        return 2
    threads = _set_threads(torch, device, args.concurrent)
    torch.manual_seed(args.seed + denv.rank)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    try:
        classes, batches_for = _data(args, device, denv)
        model = build_model(args.model, classes, args.image_size, weights="none")
    except GpupoolError as err:
        print(f"bench worker: {err.message}", file=sys.stderr)
        return 2
    cuda = device.type == "cuda"
    channels_last = args.channels_last if args.channels_last is not None else cuda
    amp_dtype = None
    if cuda and not args.no_amp:
        amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    distributed.init(denv, device)
    try:
        model.to(device)
        if channels_last:
            model.to(memory_format=torch.channels_last)
        train_model: torch.nn.Module = model
        if denv.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            train_model = DDP(model, device_ids=[device.index] if cuda else None, gradient_as_bucket_view=True)
        if args.compile:
            train_model = torch.compile(train_model)  # type: ignore[assignment]
        params = [p for p in model.parameters() if p.requires_grad]
        opt_kwargs: Dict[str, Any] = {"fused": True} if cuda else {"foreach": True}
        optimizer = torch.optim.Adam(params, lr=1e-3, **opt_kwargs)
        scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
        eng = Engine(train_model, model, Normalizer(channels_last).to(device), optimizer, scaler, device, amp_dtype)
        train_model.train()

        unreadable: Set[int] = set()

        def step(images: Any, labels: Any, index: Any) -> int:
            # The trainer's own step: device-side normalise, autocast forward, fp32 loss,
            # scaled backward and optimizer step.
            train_step(eng, images, labels, index, unreadable)
            return int(images.shape[0])

        batches = batches_for()
        progress = Progress(out / f"progress-{args.tag}.json" if denv.is_main else None, args.warmup + args.steps)
        progress.update("warmup", 0, force=True)
        for i in range(args.warmup):
            step(*next(batches))
            progress.update("warmup", i + 1)
        eng.sync()
        line = StartLine(out, args.tag, args.peers) if args.peers > 1 else None
        if line is not None and denv.is_main:
            progress.update("waiting", args.warmup, force=True)
            line.arrive(args.start_timeout)
        distributed.barrier()  # the ranks of one job leave the start line together

        clock = _StepClock(torch, device)
        images = 0
        for i in range(args.steps):
            images += step(*next(batches))
            clock.mark()
            progress.update("measure", args.warmup + i + 1)
        step_seconds, seconds = clock.finish()
        memory = _memory(torch, device)
        held = 0.0
        if line is not None:
            line.finish()
            t_hold = time.perf_counter()
            end = time.monotonic() + max(60.0, 10 * seconds)
            progress.update("holding", args.warmup + args.steps, force=True)
            while not line.all_done() and time.monotonic() < end:
                step(*next(batches))
            eng.sync()
            held = time.perf_counter() - t_hold
        progress.update("done", args.warmup + args.steps, force=True)
        result = {
            "tag": args.tag,
            "rank": denv.rank,
            "world_size": denv.world_size,
            "device": device.type,
            "gpu_name": torch.cuda.get_device_name(device) if cuda else None,
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "amp": str(amp_dtype).replace("torch.", "") if amp_dtype else None,
            "channels_last": channels_last,
            "compile": args.compile,
            "threads": threads,
            "torch": torch.__version__,
            "model": args.model,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "data": args.data or "synthetic",
            "warmup": args.warmup,
            "steps": args.steps,
            "images": images,
            "seconds": seconds,
            "step_seconds": step_seconds,
            "held_seconds": round(held, 3),
            "memory": memory,
        }
        write_json_atomic(result, out / f"result-{args.tag}-r{denv.rank}.json")
        distributed.barrier()
    finally:
        distributed.shutdown()
    return 0


def _set_threads(torch: Any, device: Any, concurrent: int) -> int:
    """CPU workers split the cores between the run's processes unless OMP_NUM_THREADS says."""
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cpus // max(1, concurrent)))
    return int(torch.get_num_threads())


def _data(args: argparse.Namespace, device: Any, denv: Any) -> Tuple[int, Any]:
    """(number of classes, a function returning an endless batch iterator)."""
    import torch

    if args.data is None:

        def synthetic() -> Iterator[Tuple[Any, Any, Any]]:
            # uint8, channels_last images already on the device (the loader's output, copied
            # over); labels on the host, as the loader hands them to the trainer's step.
            s = args.image_size
            gen = torch.Generator(device="cpu").manual_seed(args.seed)
            images = torch.randint(0, 256, (args.batch_size, 3, s, s), dtype=torch.uint8, generator=gen)
            images = images.contiguous(memory_format=torch.channels_last).to(device)
            labels = torch.randint(0, args.classes, (args.batch_size,), generator=gen)
            index = torch.arange(args.batch_size)
            if device.type == "cuda":
                labels = labels.pin_memory()
            while True:
                yield images, labels, index

        return args.classes, synthetic

    from gpupool.core.errors import InvalidInput
    from gpupool.train.data import ImageFiles, default_workers, make_loader, scan_class_folders

    root = Path(args.data)
    classes, samples = scan_class_folders(root)
    if len(samples) < args.batch_size * denv.world_size:
        raise InvalidInput(
            f"{root} has {len(samples)} images, fewer than one batch per worker "
            f"({args.batch_size} x {denv.world_size}); add images or lower --batch-size"
        )
    workers = args.loader_workers if args.loader_workers is not None else default_workers(device.type, args.concurrent)
    loader, sampler = make_loader(
        ImageFiles(root, samples, args.image_size),
        args.batch_size,
        workers,
        device.type == "cuda",
        True,
        args.seed,
        denv.rank,
        denv.world_size,
    )

    def files() -> Iterator[Tuple[Any, Any, Any]]:
        epoch = 0
        while True:
            if sampler is not None:
                sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    return len(classes), files


class _StepClock:
    """Per-step wall times: CUDA events on a GPU (read once at the end, no per-step sync),
    the host clock on a CPU (where a step is done when it returns)."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self._sync()
        self.t0 = time.perf_counter()
        self.marks: List[Any] = []
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def mark(self) -> None:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def finish(self) -> Tuple[List[float], float]:
        """(seconds of each step, seconds of all of them)."""
        self._sync()
        total = time.perf_counter() - self.t0
        if self.cuda:
            ends = [self.start.elapsed_time(e) / 1000.0 for e in self.marks]
        else:
            ends = [t - self.t0 for t in self.marks]
        steps = [round(b - a, 6) for a, b in zip([0.0] + ends[:-1], ends)]
        return steps, round(total, 6)


def _memory(torch: Any, device: Any) -> Dict[str, Optional[float]]:
    """Peak memory: the process's RSS; on a GPU torch's peak allocated and reserved, and
    what NVML says the process holds (context included) where NVML is present."""
    out: Dict[str, Optional[float]] = {
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "gpu_allocated_mib": None,
        "gpu_reserved_mib": None,
        "gpu_used_mib": None,
    }
    if device.type != "cuda":
        return out
    mib = 1024 * 1024
    out["gpu_allocated_mib"] = round(torch.cuda.max_memory_allocated(device) / mib, 1)
    out["gpu_reserved_mib"] = round(torch.cuda.max_memory_reserved(device) / mib, 1)
    out["gpu_used_mib"] = _nvml_used_mib(device.index or 0)
    return out


def _nvml_used_mib(index: int) -> Optional[float]:
    """This process's memory on visible GPU `index` as NVML sees it; None without NVML."""
    try:
        from gpupool.pooling.devices.nvml import load_nvml, shutdown_nvml

        nvml = load_nvml()
    except Exception:
        return None
    try:
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
        if visible and not visible[index].isdigit():
            handle = nvml.nvmlDeviceGetHandleByUUID(visible[index])
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(int(visible[index]) if visible else index)
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return round(float(proc.usedGpuMemory) / (1024 * 1024), 1)
        return None
    except Exception:  # a foreign driver, MPS hiding client pids ...: the figure is optional
        return None
    finally:
        shutdown_nvml(nvml)


if __name__ == "__main__":
    sys.exit(main())
