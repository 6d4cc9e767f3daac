"""One training epoch and one evaluation pass.

Per-step work stays on the device: losses and counts are kept as device scalars and
read (a host sync) only when the progress bar refreshes and at the end of the epoch,
so a fast GPU is never stalled by bookkeeping. Counts are reduced across ranks at the end.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

import torch
import torch.nn.functional as F

from gpupool.train import distributed
from gpupool.train.data import BAD_LABEL

PROGRESS_REFRESH_S = 1.0


@dataclass
class Engine:
    """What a step needs: the model to train (maybe DDP- and compile-wrapped), the plain
    model for evaluation, the input normaliser, optimiser, scaler and autocast settings."""

    model: torch.nn.Module
    raw_model: torch.nn.Module
    normalizer: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any
    device: torch.device
    amp_dtype: Optional[torch.dtype]

    def autocast(self) -> Any:
        """bf16/fp16 autocast on the device, or nothing."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def sync(self) -> None:
        """Wait for queued device work (timing needs it; CPU work is already done)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass
class EpochResult:
    """Reduced over all ranks."""

    loss: float
    accuracy: float
    images: int
    steady_images: int = 0
    steady_seconds: float = 0.0
    bad_indices: Set[int] = field(default_factory=set)
    confusion: Optional[List[List[int]]] = None
    # Set when a stop request ended the epoch early: what a checkpoint needs to finish it later.
    partial: Optional[PartialEpoch] = None

    @property
    def images_per_second(self) -> float:
        """Steady-state throughput (after the epoch's first batch)."""
        return self.steady_images / self.steady_seconds if self.steady_seconds > 0 else 0.0


@dataclass
class PartialEpoch:
    """An epoch stopped after `steps` optimizer steps: this rank's running sums so far, so the
    resumed epoch reports the same metrics as an unbroken one (as far as the data order allows)."""

    steps: int
    loss_sum: float = 0.0
    correct: float = 0.0
    valid: int = 0
    steady_images: int = 0
    steady_seconds: float = 0.0
    bad_indices: List[int] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "steps": self.steps,
            "loss_sum": self.loss_sum,
            "correct": self.correct,
            "valid": self.valid,
            "steady_images": self.steady_images,
            "steady_seconds": self.steady_seconds,
            "bad_indices": list(self.bad_indices),
        }

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> PartialEpoch:
        return cls(
            steps=int(data["steps"]),
            loss_sum=float(data.get("loss_sum", 0.0)),
            correct=float(data.get("correct", 0.0)),
            valid=int(data.get("valid", 0)),
            steady_images=int(data.get("steady_images", 0)),
            steady_seconds=float(data.get("steady_seconds", 0.0)),
            bad_indices=[int(i) for i in data.get("bad_indices", [])],
        )


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True, mininterval=0.5)


def train_epoch(
    eng: Engine,
    loader: Iterable[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    steps: int,
    desc: str,
    show_progress: bool,
    max_steps: Optional[int] = None,
    resume: Optional[PartialEpoch] = None,
    stop: Optional[Callable[[], bool]] = None,
) -> EpochResult:
    """Train for one pass over this rank's shard; returns metrics summed over all ranks.

    Throughput is timed from the end of the first step (worker start-up, autotuning and
    compilation excluded) to the end of the epoch, images counted over that span.

    `resume`: the epoch was stopped after `resume.steps` steps, and `loader` starts where it
    stopped; its sums carry on. `stop`: asked after every step; True ends the epoch there, and
    the result's `partial` says how far it got (its metrics are not reduced over ranks then).
    """
    eng.model.train()
    dev = eng.device
    sums = _Sums(dev)
    bad: Set[int] = set()
    first = 0
    carried_images, carried_seconds = 0, 0.0
    if resume is not None:
        first = resume.steps
        sums.carry(resume.loss_sum, resume.correct, resume.valid)
        bad.update(resume.bad_indices)
        carried_images, carried_seconds = resume.steady_images, resume.steady_seconds
    bar = _progress(min(steps, max_steps or steps), desc, show_progress)
    if bar is not None and first:
        bar.update(first)
    t0 = last_refresh = time.perf_counter()
    t_steady: Optional[float] = None
    steady_images = 0
    done = first
    for step, (images, labels, index) in enumerate(loader, start=first):
        if max_steps is not None and step >= max_steps:
            break
        logits, y, loss_sum, valid = train_step(eng, images, labels, index, bad)
        done = step + 1
        with torch.no_grad():
            sums.add(loss_sum.detach(), (logits.argmax(1) == y).sum(), valid)
        if t_steady is None:
            eng.sync()
            t_steady = time.perf_counter()
        else:
            steady_images += images.shape[0]
        if stop is not None and stop():
            eng.sync()
            s = sums.total().tolist()
            if bar is not None:
                bar.close()
            partial = PartialEpoch(
                steps=done,
                loss_sum=s[0],
                correct=s[1],
                valid=int(s[2]),
                steady_images=carried_images + steady_images,
                steady_seconds=carried_seconds + (time.perf_counter() - t_steady),
                bad_indices=sorted(bad),
            )
            return EpochResult(loss=0.0, accuracy=0.0, images=int(s[2]), bad_indices=bad, partial=partial)
        if bar is not None:
            bar.update(1)
            now = time.perf_counter()
            if now - last_refresh >= PROGRESS_REFRESH_S:
                last_refresh = now
                s = sums.total().tolist()
                rate = steady_images / (now - t_steady) if t_steady and now > t_steady else 0.0
                bar.set_postfix(
                    loss=f"{s[0] / max(s[2], 1):.4f}",
                    acc=f"{s[1] / max(s[2], 1):.3f}",
                    img_s=f"{rate * distributed_world():.0f}",
                )
    eng.sync()
    t_end = time.perf_counter()
    if bar is not None:
        bar.close()
    totals = sums.total()
    if steady_images == 0 and not carried_images:  # a one-batch epoch: no steady state, use it all
        steady_images = sums.valid + len(bad)
        t_steady = t0
    distributed.all_reduce_sum(totals)
    images = torch.tensor([float(carried_images + steady_images)], dtype=torch.float64, device=dev)
    seconds = torch.tensor([carried_seconds + t_end - (t_steady or t0)], dtype=torch.float64, device=dev)
    distributed.all_reduce_sum(images)
    distributed.all_reduce_max(seconds)  # the slowest rank sets the pace
    s = totals.tolist()
    return EpochResult(
        loss=s[0] / max(s[2], 1),
        accuracy=s[1] / max(s[2], 1),
        images=int(s[2]),
        steady_images=int(images.item()),
        steady_seconds=float(seconds.item()),
        bad_indices=bad,
    )


def train_step(
    eng: Engine, images: torch.Tensor, labels: torch.Tensor, index: torch.Tensor, bad: Set[int]
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """One optimizer step on one batch (uint8 images, host labels): forward as `_forward`
    does, the mean loss over the readable images, scaled backward and step. Returns what
    `_forward` returns, for the caller's metrics. `gpupool bench` times exactly this."""
    logits, y, loss_sum, valid = _forward(eng, eng.model, images, labels, index, bad)
    loss = loss_sum / max(valid, 1)
    eng.optimizer.zero_grad(set_to_none=True)
    eng.scaler.scale(loss).backward()
    eng.scaler.step(eng.optimizer)
    eng.scaler.update()
    return logits, y, loss_sum, valid


class _Sums:
    """Per-step loss sums and correct counts, kept as device scalars in lists (no
    arithmetic per step) and folded into a float64 total every FOLD_EVERY steps and when
    read; the valid-image count is a host integer, known from the host-side labels."""

    FOLD_EVERY = 256

    def __init__(self, device: torch.device) -> None:
        self.acc = torch.zeros(2, device=device, dtype=torch.float64)
        self.losses: List[torch.Tensor] = []
        self.corrects: List[torch.Tensor] = []
        self.valid = 0

    def carry(self, loss_sum: float, correct: float, valid: int) -> None:
        """Start from the sums of a stopped part of this epoch."""
        self.acc += torch.tensor([loss_sum, correct], dtype=torch.float64, device=self.acc.device)
        self.valid += valid

    def add(self, loss_sum: torch.Tensor, correct: torch.Tensor, valid: int) -> None:
        self.losses.append(loss_sum)
        self.corrects.append(correct)
        self.valid += valid
        if len(self.losses) >= self.FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        if self.losses:
            self.acc += torch.stack(
                [torch.stack(self.losses).double().sum(), torch.stack(self.corrects).double().sum()]
            )
            self.losses, self.corrects = [], []

    def total(self) -> torch.Tensor:
        """[loss sum, correct, valid] as float64 on the device."""
        self._fold()
        valid = torch.tensor([float(self.valid)], dtype=torch.float64, device=self.acc.device)
        return torch.cat([self.acc, valid])


def distributed_world() -> int:
    """World size for the progress bar's global images/second estimate."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _forward(
    eng: Engine, model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, index: torch.Tensor, bad: Set[int]
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """One batch through `model`: (logits, device labels, fp32 loss sum, readable images).

    Unreadable images are added to `bad` while the labels are still on the host, so
    counting them costs no device sync; they weigh nothing in the loss.
    """
    valid = labels.shape[0]
    bad_mask = labels == BAD_LABEL
    if bool(bad_mask.any()):
        bad_now = index[bad_mask].tolist()
        bad.update(bad_now)
        valid -= len(bad_now)
    x = eng.normalizer(images.to(eng.device, non_blocking=True))
    y = labels.to(eng.device, non_blocking=True)
    with eng.autocast():
        logits = model(x)
    # The loss in fp32 whatever autocast did.
    loss_sum = F.cross_entropy(logits.float(), y, ignore_index=BAD_LABEL, reduction="sum")
    return logits, y, loss_sum, valid


@torch.no_grad()
def evaluate(
    eng: Engine,
    loader: Iterable[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    num_classes: int,
    max_steps: Optional[int] = None,
) -> EpochResult:
    """Loss, accuracy and confusion matrix over this rank's shard, summed over all ranks.

    Uses the plain model, not the DDP wrapper: ranks hold shards of different sizes here,
    and DDP's per-forward buffer broadcast would pair up mismatched calls.
    """
    model = eng.raw_model
    was_training = model.training
    model.eval()
    dev = eng.device
    sums = torch.zeros(3, device=dev, dtype=torch.float64)
    confusion = torch.zeros(num_classes * num_classes, device=dev, dtype=torch.long)
    bad: Set[int] = set()
    for step, (images, labels, index) in enumerate(loader):
        if max_steps is not None and step >= max_steps:
            break
        logits, y, loss_sum, _ = _forward(eng, model, images, labels, index, bad)
        keep = y != BAD_LABEL
        pred = logits.argmax(1)
        sums += torch.stack([loss_sum.double(), (pred == y).sum().double(), keep.sum().double()])
        confusion += torch.bincount(y[keep] * num_classes + pred[keep], minlength=num_classes * num_classes)
    distributed.all_reduce_sum(sums)
    distributed.all_reduce_sum(confusion)
    model.train(was_training)
    s = sums.tolist()
    matrix = confusion.view(num_classes, num_classes).tolist()
    return EpochResult(
        loss=s[0] / max(s[2], 1), accuracy=s[1] / max(s[2], 1), images=int(s[2]), bad_indices=bad, confusion=matrix
    )


def epoch_row(epoch: int, train: EpochResult, val: EpochResult, lr: float, seconds: float) -> Dict[str, Any]:
    """One metrics.jsonl row."""
    return {
        "epoch": epoch,
        "train_loss": round(train.loss, 6),
        "train_accuracy": round(train.accuracy, 6),
        "val_loss": round(val.loss, 6),
        "val_accuracy": round(val.accuracy, 6),
        "images_per_second": round(train.images_per_second, 2),
        "steady_images": train.steady_images,
        "steady_seconds": round(train.steady_seconds, 6),
        "lr": lr,
        "epoch_seconds": round(seconds, 3),
    }
