"""The distributed env contract (as torchrun sets it) and the few collectives the trainer uses.

The trainer knows nothing of the pool: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`
and `MASTER_PORT` are all it reads, so `torchrun`, `gpupool submit` and a hand-written
launcher all work. With WORLD_SIZE unset or 1 nothing is initialised at all.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Mapping, Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def enabled(self) -> bool:
        """True when more than one process trains together."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes checkpoints, logs and reports."""
        return self.rank == 0


def read_env(environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Read the torchrun env contract; missing variables mean a single process.

    Raises:
        ValueError: a variable is not an integer or RANK is outside WORLD_SIZE.
    """
    env = os.environ if environ is None else environ

    def _int(name: str, default: int) -> int:
        raw = env.get(name)
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer") from None

    world = _int("WORLD_SIZE", 1)
    rank = _int("RANK", 0)
    local_rank = _int("LOCAL_RANK", rank if world > 1 else 0)
    local_world = _int("LOCAL_WORLD_SIZE", world)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must be in [0, WORLD_SIZE={world})")
    if world > 1:
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if not env.get(name):
                raise ValueError(f"WORLD_SIZE={world} but {name} is not set; launch with torchrun or set it")
    return DistEnv(rank=rank, world_size=world, local_rank=local_rank, local_world_size=max(1, local_world))


def pick_device(denv: DistEnv, requested: Optional[str] = None) -> torch.device:
    """CUDA device LOCAL_RANK (wrapped onto the visible GPUs, so fractional shares of one
    GPU work), else CPU. `requested` ("cpu", "cuda", "cuda:1") overrides."""
    if requested and requested != "auto":
        dev = torch.device(requested)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", denv.local_rank % max(1, torch.cuda.device_count()))
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda", denv.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init(denv: DistEnv, device: torch.device) -> None:
    """Join the process group (NCCL on GPU, gloo on CPU); a no-op for one process."""
    if not denv.enabled or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    # A generous timeout: rank 0 alone evaluates and exports at the end, the others wait.
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=denv.rank,
        world_size=denv.world_size,
        timeout=datetime.timedelta(minutes=30),
    )


def shutdown() -> None:
    """Leave the process group if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_initialized() -> bool:
    """Whether this process is in a process group (more than one rank)."""
    return bool(dist.is_available() and dist.is_initialized())


def barrier() -> None:
    """Wait for every rank (no-op for one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place and return it (identity for one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """Max of a tensor over ranks in place (identity for one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t
