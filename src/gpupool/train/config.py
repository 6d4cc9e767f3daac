"""Training configuration: one frozen dataclass, built from defaults, a preset and flags.

Precedence is defaults < preset < explicit flags, so `--preset vgg19-transfer --lr 3e-4`
keeps the whole recipe but the learning rate. This module imports no torch: the CLI
validates a configuration before paying for the torch import.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

MODEL_NAMES: Tuple[str, ...] = ("convnet", "resnet18", "resnet50", "vgg16", "vgg19")
HEAD_NAMES: Tuple[str, ...] = ("linear", "mlp")
SCHEDULES: Tuple[str, ...] = ("constant", "cosine")
MODEL_DEFAULTS: Dict[str, Dict[str, Any]] = {"convnet": {"lr": 3e-3}}
# The job's checkpoint place (a job spec's `checkpoints:`), set in every replica: the default --out.
CHECKPOINTS_ENV = "GPUPOOL_CHECKPOINTS"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides what a training run does.

    `weights` is a path, "none" (train from scratch) or None (not given: the model
    decides — torchvision backbones then ask for a path, the ConvNet starts random).
    `train_last` is the number of backbone layers left trainable, "all", or None
    (frozen backbone when pretrained weights are loaded, everything trainable when not).
    """

    data: str
    out: str
    model: str = "resnet18"
    weights: Optional[str] = None
    train_last: Optional[str] = None
    head: str = "linear"
    hidden: int = 30
    dropout: float = 0.0
    image_size: int = 224
    epochs: int = 30
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    schedule: str = "constant"
    patience: int = 5
    workers: Optional[int] = None
    seed: int = 0
    split: Tuple[float, float, float] = (0.70, 0.15, 0.15)
    hflip: bool = False
    compile: bool = False
    amp: bool = True
    channels_last: Optional[bool] = None
    device: Optional[str] = None
    resume: bool = True
    preset: Optional[str] = None
    max_steps_per_epoch: Optional[int] = None
    progress: Optional[bool] = None
    # Bucket URLs (--data/--out s3://...): the local cache's folder and size (bytes) for the
    # data set, and how many checkpoints the bucket keeps.
    cache_dir: Optional[str] = None
    cache_size: Optional[int] = None
    keep_checkpoints: int = 3

    def structural(self) -> Dict[str, Any]:
        """The fields a resumed run must share with the run that wrote the checkpoint."""
        return {
            "model": self.model,
            "head": self.head,
            "hidden": self.hidden,
            "image_size": self.image_size,
            "seed": self.seed,
            "split": list(self.split),
        }

    def to_json(self) -> Dict[str, Any]:
        """A JSON-safe dict (tuples become lists)."""
        d = dataclasses.asdict(self)
        d["split"] = list(self.split)
        return d


def parse_split(text: str) -> Tuple[float, float, float]:
    """Parse "70/15/15" or "0.7,0.15,0.15" into fractions summing to 1."""
    parts = [p for p in text.replace(",", "/").split("/") if p.strip()]
    if len(parts) != 3:
        raise ValueError(f"split {text!r} needs three parts, train/val/test, e.g. 70/15/15")
    nums = [float(p) for p in parts]
    if any(n < 0 for n in nums) or sum(nums) <= 0:
        raise ValueError(f"split {text!r} must be non-negative and not all zero")
    total = sum(nums)
    train, val, test = (n / total for n in nums)
    if train <= 0 or val <= 0 or test <= 0:
        raise ValueError(f"split {text!r}: train, val and test must all be > 0")
    return (train, val, test)


def build_config(
    data: str,
    out: str,
    preset: Optional[str] = None,
    overrides: Optional[Mapping[str, Any]] = None,
) -> TrainConfig:
    """Merge defaults, a preset and explicit overrides (None values mean "not given").

    Raises:
        ValueError: unknown preset, model, head or an out-of-range value.
    """
    from gpupool.train.presets import preset_values

    values: Dict[str, Any] = {}
    if preset:
        values.update(preset_values(preset))
        values["preset"] = preset
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    # Per-model defaults fill what neither the preset nor a flag set: a ConvNet trained
    # from scratch wants a larger step than a pretrained backbone being fine-tuned.
    for key, value in MODEL_DEFAULTS.get(values.get("model", TrainConfig.model), {}).items():
        values.setdefault(key, value)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown training option(s): {', '.join(sorted(unknown))}")
    cfg = TrainConfig(data=data, out=out, **values)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Check ranges that need no data or torch; raise ValueError naming the bad value."""
    if cfg.model not in MODEL_NAMES:
        raise ValueError(f"unknown model {cfg.model!r}; choose one of {', '.join(MODEL_NAMES)}")
    if cfg.head not in HEAD_NAMES:
        raise ValueError(f"unknown head {cfg.head!r}; choose one of {', '.join(HEAD_NAMES)}")
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {cfg.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    checks = [
        (cfg.epochs >= 1, f"--epochs must be >= 1, got {cfg.epochs}"),
        (cfg.batch_size >= 1, f"--batch-size must be >= 1, got {cfg.batch_size}"),
        (cfg.lr > 0, f"--lr must be > 0, got {cfg.lr}"),
        (cfg.patience >= 1, f"--patience must be >= 1, got {cfg.patience}"),
        (cfg.image_size >= 1, f"--image-size must be >= 1, got {cfg.image_size}"),
        (0.0 <= cfg.dropout < 1.0, f"--dropout must be in [0, 1), got {cfg.dropout}"),
        (cfg.hidden >= 1, f"--hidden must be >= 1, got {cfg.hidden}"),
        (cfg.workers is None or cfg.workers >= 0, f"--workers must be >= 0, got {cfg.workers}"),
        (cfg.keep_checkpoints >= 1, f"--keep-checkpoints must be >= 1, got {cfg.keep_checkpoints}"),
        (cfg.cache_size is None or cfg.cache_size > 0, f"--cache-size must be > 0, got {cfg.cache_size}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    if cfg.train_last is not None and cfg.train_last != "all":
        try:
            if int(cfg.train_last) < 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"--train-last must be a number >= 0 or 'all', got {cfg.train_last!r}") from None


def save_config(cfg: TrainConfig, path: Path) -> None:
    """Write the configuration as JSON (for people; the checkpoint holds its own copy)."""
    path.write_text(json.dumps(cfg.to_json(), indent=2, sort_keys=True) + "\n")
