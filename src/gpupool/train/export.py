"""The best model, saved for serving.

RUN/model.pt is a plain dict: the state dict, the class names, how to rebuild the network
(no pretrained file needed: the state dict holds every weight) and the preprocessing.
RUN/model.torchscript.pt is a self-contained TorchScript module that takes uint8 RGB
images (N x 3 x S x S) and returns class probabilities, for serving without gpupool.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from gpupool.core.errors import InvalidInput
from gpupool.train.checkpoint import atomic_save
from gpupool.train.data import MEAN, STD, Normalizer
from gpupool.train.networks import Classifier, build_model, load_tensors_file

log = logging.getLogger(__name__)

MODEL_FILE = "model.pt"
SCRIPT_FILE = "model.torchscript.pt"
FORMAT = "gpupool.classifier/1"


class Serving(nn.Module):
    """uint8 images in, probabilities out: the preprocessing travels with the weights."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.normalize = Normalizer()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """N x 3 x S x S uint8 -> N x K probabilities."""
        return torch.softmax(self.model(self.normalize(images)).float(), dim=1)


def save_serving(
    out: Path,
    model: Classifier,
    classes: Sequence[str],
    arch: Dict[str, Any],
    image_size: int,
    class_names: Optional[Dict[str, str]] = None,
) -> Dict[str, Optional[str]]:
    """Write model.pt and (best effort) model.torchscript.pt; returns the file names."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    payload = {
        "format": FORMAT,
        "state_dict": state,
        "classes": list(classes),
        "class_names": dict(class_names or {}),
        "arch": dict(arch),
        "preprocess": {
            "image_size": image_size,
            "resize": "square",
            "mean": list(MEAN),
            "std": list(STD),
            "input": "RGB, scaled to [0, 255] then normalised with mean/std x 255",
        },
    }
    atomic_save(payload, out / MODEL_FILE)
    files: Dict[str, Optional[str]] = {"state_dict": MODEL_FILE, "torchscript": None}
    try:
        cpu_model = build_model(
            num_classes=len(classes), image_size=image_size, weights="none", train_last="all", **arch
        )
        cpu_model.load_state_dict(state)
        serving = Serving(cpu_model).eval()
        example = torch.zeros(1, 3, image_size, image_size, dtype=torch.uint8)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # TorchScript deprecation notices are not the user's problem
            traced = torch.jit.trace(serving, example)  # type: ignore[no-untyped-call]  # unannotated in torch
            tmp = out / f".{SCRIPT_FILE}.tmp"
            traced.save(str(tmp))
            tmp.replace(out / SCRIPT_FILE)
        files["torchscript"] = SCRIPT_FILE
    except Exception as err:  # export is a convenience; the state dict above is the contract
        log.warning("TorchScript export failed (%s); model.pt is still complete", err)
    return files


def load_serving(path: Path) -> Tuple[Classifier, Dict[str, Any]]:
    """Rebuild the network from RUN/model.pt (or RUN itself); returns (model in eval mode, payload).

    Raises:
        InvalidInput: no model file there, or not one of ours.
    """
    file = path / MODEL_FILE if path.is_dir() else path
    if not file.is_file():
        raise InvalidInput(f"no trained model at {file}; train one with `gpupool train --out {path}`")
    payload = load_tensors_file(file, "model file", "train one with `gpupool train --out DIR`")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise InvalidInput(f"{file} is not a gpupool model (expected format {FORMAT})")
    size = int(payload["preprocess"]["image_size"])
    model = build_model(
        num_classes=len(payload["classes"]), image_size=size, weights="none", train_last="all", **payload["arch"]
    )
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return model, payload
