"""Backbones (torchvision VGG/ResNet, a small ConvNet), pretrained weights from a local file,
layer freezing and a new head for the data set's classes.

The model is always `Classifier(backbone, head)`. `units` lists the backbone's layers in
order (VGG: each convolution; ResNet: the stem and each residual block; ConvNet: each conv
block) so that `--train-last K` means the same thing on every backbone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from gpupool.core.errors import InvalidInput

log = logging.getLogger(__name__)

# Where the ImageNet weights torchvision itself uses live; the trainer never downloads.
WEIGHT_URLS: Dict[str, str] = {
    "vgg16": "https://download.pytorch.org/models/vgg16-397923af.pth",
    "vgg19": "https://download.pytorch.org/models/vgg19-dcbb9e9d.pth",
    "resnet18": "https://download.pytorch.org/models/resnet18-f37072fd.pth",
    "resnet50": "https://download.pytorch.org/models/resnet50-11ad3fa6.pth",
}
# Smallest input each backbone can take: five stride-2 stages need 32 px.
MIN_IMAGE_SIZE: Dict[str, int] = {"vgg16": 32, "vgg19": 32, "resnet18": 32, "resnet50": 32, "convnet": 8}


class ConvNet(nn.Module):
    """Three conv-BN-ReLU-pool blocks and a global average pool: fast on CPU, enough for
    digits/CIFAR-sized images (8-64 px). Returns N x 128 x 1 x 1 features."""

    def __init__(self, widths: Tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        blocks: List[nn.Module] = []
        c_in = 3
        for c_out in widths:
            blocks.append(
                nn.Sequential(
                    nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                    nn.BatchNorm2d(c_out, momentum=0.3),  # fast-tracking stats: short runs evaluate well
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(2, ceil_mode=True),
                )
            )
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.out_features = c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Features, N x C x 1 x 1."""
        features: torch.Tensor = self.pool(self.blocks(x))
        return features


class Classifier(nn.Module):
    """backbone -> head. Frozen units stay in eval mode (BatchNorm statistics frozen too,
    as Keras does with `trainable=False`) whatever `train()` is called with."""

    def __init__(self, backbone: nn.Module, head: nn.Sequential, units: List[nn.Module]) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        # A plain list, not a ModuleList: the units are already registered under backbone.
        self._units = units
        self._frozen: List[nn.Module] = []

    @property
    def units(self) -> List[nn.Module]:
        """The backbone's layers, input side first."""
        return self._units

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, N x K."""
        logits: torch.Tensor = self.head(self.backbone(x))
        return logits

    def freeze(self, train_last: Optional[str]) -> int:
        """Freeze all but the last K backbone units ("all": none frozen). Returns the number
        of frozen units."""
        if train_last is None or train_last == "all":
            keep = len(self._units)
        else:
            keep = min(int(train_last), len(self._units))
        frozen = self._units[: len(self._units) - keep]
        trainable = self._units[len(self._units) - keep :]
        for unit in frozen:
            for p in unit.parameters():
                p.requires_grad_(False)
        for unit in trainable:
            for p in unit.parameters():
                p.requires_grad_(True)
        # Parameters outside any unit (none today) follow the "all frozen" choice.
        self._frozen = list(frozen)
        self.train(self.training)
        return len(frozen)

    def train(self, mode: bool = True) -> Classifier:
        """Set the mode, keeping frozen units in eval."""
        super().train(mode)
        for unit in self._frozen:
            unit.eval()
        return self


def _torchvision_model(name: str) -> nn.Module:
    import torchvision

    model: nn.Module = getattr(torchvision.models, name)(weights=None)
    return model


def _sequential(parent: nn.Module, name: str) -> nn.Sequential:
    """The Sequential child `name` of a torchvision model (VGG's features, ResNet's layers)."""
    child = parent.get_submodule(name)
    if not isinstance(child, nn.Sequential):
        raise TypeError(f"{type(parent).__name__}.{name} is a {type(child).__name__}, not a Sequential")
    return child


def load_tensors_file(file: Path, what: str, hint: str) -> Any:
    """torch.load of a tensors-only file (weights_only=True) onto the CPU.

    Raises:
        InvalidInput: naming `what`, the file and `hint` when it cannot be read.
    """
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:
        # torch's own message runs to paragraphs and suggests weights_only=False, which would
        # run code from the file: name the file and the fix instead.
        raise InvalidInput(
            f"cannot read {what} {file} ({type(err).__name__}: damaged, or not a saved state dict); {hint}"
        ) from None


def _load_weights(model: nn.Module, name: str, path: str) -> None:
    """Load a torchvision-format state dict (the full ImageNet model) from `path`.

    The original classifier is replaced afterwards, so only backbone keys must match.
    """
    file = Path(path).expanduser()
    hint = (
        f"download the ImageNet weights for {name} from {WEIGHT_URLS.get(name, 'torchvision')} "
        f"and pass --weights PATH, or pass --weights none to train from scratch"
    )
    if not file.is_file():
        raise InvalidInput(f"weights file {file} does not exist; {hint}")
    state = load_tensors_file(file, "weights file", hint)
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise InvalidInput(f"weights file {file} holds no state dict; {hint}")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    head_prefixes = ("classifier.", "fc.")
    backbone_state = {k: v for k, v in state.items() if not k.startswith(head_prefixes)}
    expected = {k for k in model.state_dict() if not k.startswith(head_prefixes)}
    missing = sorted(expected - set(backbone_state))
    unexpected = sorted(set(backbone_state) - expected)
    if missing or unexpected:
        example = (missing or unexpected)[0]
        raise InvalidInput(
            f"weights file {file} does not fit {name} ({len(missing)} missing, {len(unexpected)} unexpected "
            f"keys, e.g. {example!r}); {hint}"
        )
    try:
        model.load_state_dict(backbone_state, strict=False)
    except RuntimeError as err:
        raise InvalidInput(f"weights file {file} does not fit {name}: {err}") from None
    log.info("loaded %s backbone weights from %s", name, file)


def _backbone(name: str, weights: Optional[str]) -> Tuple[nn.Module, List[nn.Module], bool]:
    """(backbone module, units, is_pretrained)."""
    if name == "convnet":
        if weights not in (None, "none"):
            raise InvalidInput("the convnet has no pretrained weights; drop --weights or pass --weights none")
        net = ConvNet()
        return net, list(net.blocks), False
    if name not in WEIGHT_URLS:
        raise InvalidInput(f"unknown model {name!r}; choose one of {', '.join(sorted(MIN_IMAGE_SIZE))}")
    if weights is None:
        raise InvalidInput(
            f"{name} is a transfer-learning backbone and needs pretrained weights, and the trainer never "
            f"downloads: get {WEIGHT_URLS[name]} and pass --weights PATH, or pass --weights none to train "
            "from scratch"
        )
    full = _torchvision_model(name)
    pretrained = weights != "none"
    if pretrained:
        _load_weights(full, name, weights)
    if name.startswith("vgg"):
        # Keras' VGG19(include_top=False) ends at block5_pool: no avgpool, no classifier.
        features = _sequential(full, "features")
        units: List[nn.Module] = [m for m in features if isinstance(m, nn.Conv2d)]
        return features, units, pretrained
    stem = nn.Sequential(*(full.get_submodule(n) for n in ("conv1", "bn1", "relu", "maxpool")))
    blocks = [b for n in ("layer1", "layer2", "layer3", "layer4") for b in _sequential(full, n)]
    backbone = nn.Sequential(stem, *blocks, full.get_submodule("avgpool"))
    return backbone, [stem, *blocks], pretrained


def feature_count(backbone: nn.Module, image_size: int) -> int:
    """Flattened feature size at this input size (one dry forward on the meta device,
    which costs no memory or compute even for VGG at 224 px)."""
    import copy

    probe = copy.deepcopy(backbone).to("meta").eval()
    with torch.no_grad():
        out = probe(torch.empty(1, 3, image_size, image_size, device="meta"))
    return int(out[0].numel())


def build_model(
    name: str,
    num_classes: int,
    image_size: int,
    weights: Optional[str] = None,
    train_last: Optional[str] = None,
    head: str = "linear",
    hidden: int = 30,
    dropout: float = 0.0,
) -> Classifier:
    """A backbone with a new head for `num_classes`, frozen as asked.

    `train_last` None means: freeze the whole backbone when pretrained weights were loaded,
    train everything when starting from scratch.

    Raises:
        InvalidInput: unknown model, image too small, missing or mismatched weights.
    """
    minimum = MIN_IMAGE_SIZE.get(name)
    if minimum is None:
        raise InvalidInput(f"unknown model {name!r}; choose one of {', '.join(sorted(MIN_IMAGE_SIZE))}")
    if image_size < minimum:
        raise InvalidInput(
            f"--image-size {image_size} is too small for {name}, which needs at least {minimum} px "
            f"(use --image-size {minimum} or more, or --model convnet for tiny images)"
        )
    backbone, units, pretrained = _backbone(name, weights)
    features = feature_count(backbone, image_size)
    layers: List[nn.Module] = [nn.Flatten()]
    if dropout > 0:
        layers.append(nn.Dropout(dropout))
    if head == "mlp":
        layers += [nn.Linear(features, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, num_classes)]
    else:
        layers.append(nn.Linear(features, num_classes))
    model = Classifier(backbone, nn.Sequential(*layers), units)
    if train_last is None:
        train_last = "0" if pretrained else "all"
    model.freeze(train_last)
    return model


def count_parameters(model: nn.Module) -> Dict[str, int]:
    """Total and trainable parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"total": total, "trainable": trainable}
