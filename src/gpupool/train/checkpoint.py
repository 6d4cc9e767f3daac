"""Atomic checkpoints: everything a resumed run needs to finish as the unbroken run would.

A checkpoint is written to a temporary file in the same directory, fsynced, then renamed
over the old one: a kill -9 at any instant leaves either the previous checkpoint or the
new one, never a torn file. It holds model, optimizer, scaler, scheduler, the epoch just
finished, the RNG states, the early-stopping state (with the best weights, so restoring
them needs nothing else) and the metric history (so metrics.jsonl can be rewritten).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Dict, Optional

import torch

CHECKPOINT_FILE = "checkpoint.pt"


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to PATH.tmp, fsync, rename over PATH, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:  # some file systems refuse to fsync a directory; the rename still holds
        pass


def rng_state() -> Dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states."""
    import numpy as np

    state: Dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Inverse of rng_state (CUDA part only where CUDA exists)."""
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        try:
            torch.cuda.set_rng_state_all(state["cuda"])
        except RuntimeError:  # a different GPU count than before: seeds differ, training goes on
            pass


def load(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The run's checkpoint, or None when there is none."""
    path = run_dir / CHECKPOINT_FILE
    if not path.exists():
        return None
    # weights_only=False: the file holds RNG tuples and numpy state, and it is our own file.
    ckpt: Dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return ckpt


def changing_state(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """A CPU snapshot of what training can change: trainable parameters and all buffers.

    Frozen parameters never move, so the best-weights snapshot leaves them out: for the
    VGG19 transfer recipe that is 80 MB less to copy and write every improving epoch.
    Restore with `load_state_dict(snapshot, strict=False)`.
    """
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    buffers = {name for name, _ in module.named_buffers()}
    keep = trainable | buffers
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items() if k in keep}
