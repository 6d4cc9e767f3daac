"""What a benchmark runs: its settings, its runs, and the job spec of each job of a run.

Pure: no torch, no pool, no files. Every job is an ordinary job spec (`jobs.spec`), parsed
and validated exactly as `gpupool submit` parses a YAML file, so a benchmark exercises the
same gang claim, rendezvous env and supervisor as any user's job.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..core.errors import InvalidInput
from ..core.quantity import parse_fraction
from ..jobs.spec import JobSpec, parse_spec

WORKER_MODULE = "gpupool.bench.worker"
MAX_NAME_PREFIX = 20  # job names must stay within jobs.spec.MAX_NAME with the run label added


class Kind(enum.Enum):
    """Which question a benchmark answers."""

    SCALING = "scaling"  # one job on 1, 2, 4 ... GPUs: throughput and efficiency
    SHARE = "share"  # 1/f jobs on one GPU at f each: aggregate, slowdown, fairness


@dataclass(frozen=True)
class Settings:
    """What every worker of a benchmark trains, and how.

    `data` None means synthetic batches made on the device (model speed alone); a
    class-folder path means the trainer's loaders decode those images.
    """

    model: str = "resnet50"
    image_size: int = 224
    batch_size: int = 64
    steps: int = 50
    warmup: int = 10
    data: Optional[str] = None
    loader_workers: Optional[int] = None
    classes: int = 1000
    device: str = "auto"
    amp: bool = True
    channels_last: Optional[bool] = None
    compile: bool = False
    seed: int = 0

    def to_dict(self) -> Dict[str, Any]:
        """JSON form, as report.json's `settings`."""
        return {
            "model": self.model,
            "image_size": self.image_size,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "warmup": self.warmup,
            "data": self.data or "synthetic",
            "loader_workers": self.loader_workers,
            "classes": self.classes if self.data is None else None,
            "device": self.device,
            "amp": self.amp,
            "channels_last": self.channels_last,
            "compile": self.compile,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Run:
    """One configuration: `jobs` concurrent jobs of `workers` replicas each, every replica
    holding `fraction` of one GPU."""

    kind: Kind
    label: str  # e.g. "gpus=2" or "fraction=0.5"
    workers: int  # replicas per job (data-parallel workers)
    fraction: float
    jobs: int  # concurrent jobs
    gpu_index: Optional[int] = None  # share: the one GPU every job lands on

    @property
    def key(self) -> str:
        """Short name-safe form of the label, for job names and folders."""
        if self.kind is Kind.SCALING:
            return f"g{self.workers}"
        percent = f"{self.fraction * 100:g}".replace(".", "p")
        return f"f{percent}"


def parse_counts(text: str) -> Tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8): distinct, increasing GPU counts >= 1."""
    try:
        counts = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise InvalidInput(f"--gpus {text!r} is not a list of whole numbers: use e.g. --gpus 1,2,4,8") from None
    if not counts or counts[0] < 1:
        raise InvalidInput(f"--gpus {text!r}: give GPU counts >= 1, e.g. --gpus 1,2,4,8")
    return tuple(counts)


def parse_fractions(text: str) -> Tuple[float, ...]:
    """'1,0.5,0.25' -> (1.0, 0.5, 0.25): distinct fractions in (0, 1], largest first, always
    with 1 (the whole-GPU job every share is compared with)."""
    values = {parse_fraction(p, "--fractions value") for p in text.split(",") if p.strip()}
    if not values:
        raise InvalidInput(f"--fractions {text!r} is empty: use e.g. --fractions 1,0.5,0.25")
    values.add(1.0)
    return tuple(sorted(values, reverse=True))


def jobs_for_fraction(fraction: float) -> int:
    """How many jobs of `fraction` fill one GPU: 1/f, rounded down (0.3 -> 3)."""
    return max(1, math.floor(1.0 / fraction + 1e-9))


def scaling_runs(counts: Sequence[int], fraction: float = 1.0) -> List[Run]:
    """One data-parallel job per GPU count."""
    return [Run(Kind.SCALING, f"gpus={n}", n, fraction, 1) for n in counts]


def share_runs(fractions: Sequence[float], gpu_index: int = 0) -> List[Run]:
    """For each fraction f, 1/f single-worker jobs on GPU `gpu_index`."""
    return [Run(Kind.SHARE, f"fraction={f:g}", 1, f, jobs_for_fraction(f), gpu_index) for f in fractions]


def job_name(prefix: str, run: Run, job: int) -> str:
    """A valid job name: 'bench-1a2b3c-g2' or 'bench-1a2b3c-f50-j1'."""
    name = f"{prefix}-{run.key}" + (f"-j{job}" if run.jobs > 1 or run.kind is Kind.SHARE else "")
    return re.sub(r"[^a-z0-9-]", "-", name.lower())


def job_tag(run: Run, job: int) -> str:
    """The name of job `job` of `run` inside the run's folder (its result and progress files)."""
    return f"j{job}" if run.kind is Kind.SHARE else "job"


def worker_command(settings: Settings, run_dir: str, tag: str, peers: int, concurrent: int) -> List[str]:
    """The replica command: `python -m gpupool.bench.worker ...` writing into `run_dir`.

    `peers` jobs meet at a start line and hold their load until all have measured (share);
    `concurrent` is how many worker processes share the machine's cores (the most any run of
    the benchmark starts), so CPU workers split the cores instead of fighting over them.
    """
    s = settings
    cmd = [
        "python",
        "-m",
        WORKER_MODULE,
        "--out",
        run_dir,
        "--tag",
        tag,
        "--model",
        s.model,
        "--image-size",
        str(s.image_size),
        "--batch-size",
        str(s.batch_size),
        "--steps",
        str(s.steps),
        "--warmup",
        str(s.warmup),
        "--classes",
        str(s.classes),
        "--device",
        s.device,
        "--seed",
        str(s.seed),
        "--peers",
        str(peers),
        "--concurrent",
        str(concurrent),
    ]
    if s.data is not None:
        cmd += ["--data", s.data]
    if s.loader_workers is not None:
        cmd += ["--loader-workers", str(s.loader_workers)]
    if not s.amp:
        cmd.append("--no-amp")
    if s.channels_last is not None:
        cmd.append("--channels-last" if s.channels_last else "--no-channels-last")
    if s.compile:
        cmd.append("--compile")
    return cmd


def most_concurrent(runs: Sequence[Run]) -> int:
    """The most worker processes any run starts at once. CPU workers take that share of the
    cores in every run, so an emulated GPU is the same amount of compute throughout."""
    return max((r.jobs * r.workers for r in runs), default=1)


def job_specs(settings: Settings, run: Run, prefix: str, run_dir: str, concurrent: int = 1) -> List[JobSpec]:
    """The job specs of one run, validated like any `gpupool submit` file; `concurrent` as
    `worker_command` takes it (see `most_concurrent`).

    Scaling: one PyTorch job with `workers` replicas, one GPU each, spread over the pool.
    Share: `jobs` single-replica jobs, each with `fraction` of GPU `gpu_index`, packed.
    """
    specs = []
    for j in range(run.jobs):
        gpu: Dict[str, Any] = {"count": 1, "fraction": run.fraction}
        if run.gpu_index is not None:
            gpu["filters"] = [f"device.index={run.gpu_index}"]
        tag = job_tag(run, j)
        command = worker_command(settings, run_dir, tag, run.jobs, concurrent)
        data = {
            "name": job_name(prefix, run, j),
            "framework": "pytorch",
            "placement": "spread" if run.kind is Kind.SCALING else "binpack",
            "restartPolicy": "Never",
            "roles": {"worker": {"replicas": run.workers, "gpu": gpu, "command": command}},
        }
        specs.append(parse_spec(data))
    return specs
