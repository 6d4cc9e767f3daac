"""SIGTERM as "stop after this step": what a preemption (or any polite stop) asks of the trainer.

The handler only sets a flag; the epoch loop reads it after each optimizer step, saves a
checkpoint with the position inside the epoch, and the trainer exits with STOPPED_EXIT_CODE.
Under DDP every rank must stop after the same step (or the others would wait at the next
all-reduce forever), so the ranks agree on the flag with a one-element all-reduce per step.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any, Optional

import torch

from gpupool.train import distributed

# What `gpupool run --requeue` sets on a rerun: named in gpupool.pooling.isolation.env, repeated here
# because the trainer imports core only (tests/train/test_train_preempt.py checks they agree).
PREEMPTED_ENV = "GPUPOOL_PREEMPTED"
ATTEMPT_ENV = "GPUPOOL_ATTEMPT"
# 128 + SIGTERM: what a shell reports for a command ended by SIGTERM.
STOPPED_EXIT_CODE = 128 + signal.SIGTERM


class StopRequest:
    """A SIGTERM flag, installed for the length of a `with` block (main thread only)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._set = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        self._set = True

    def requested(self) -> bool:
        """Whether any rank was asked to stop; every rank must call it at the same points."""
        if not distributed.is_initialized():
            return self._set
        flag = torch.tensor([1.0 if self._set else 0.0], device=self.device)
        distributed.all_reduce_max(flag)
        return bool(flag.item() > 0)


def rerun_after_preemption() -> bool:
    """Whether `gpupool run --requeue` started this process again after a preemption."""
    return os.environ.get(PREEMPTED_ENV, "") == "1"


def attempt() -> int:
    """This run's attempt number under `gpupool run --requeue` (1 when not a rerun)."""
    try:
        return max(1, int(os.environ.get(ATTEMPT_ENV, "1")))
    except ValueError:
        return 1
