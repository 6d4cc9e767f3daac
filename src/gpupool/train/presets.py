"""Named training recipes.

`vgg19-transfer` reproduces the Bitfusion "VGG19 transfer learning on ImageNet synsets"
demo, written in Keras: VGG19 without its top (frozen), then
Flatten -> Dropout(0.5) -> Dense(30, relu) -> Dense(K, softmax), Adam(1e-4), batch 64,
up to 100 epochs, EarlyStopping(monitor=val_loss, patience=5, restore_best_weights=True),
224x224 input. Softmax lives in the loss (cross-entropy on logits), as PyTorch does it.
"""

from __future__ import annotations

from typing import Any, Dict

PRESETS: Dict[str, Dict[str, Any]] = {
    "vgg19-transfer": {
        "model": "vgg19",
        "head": "mlp",
        "hidden": 30,
        "dropout": 0.5,
        "train_last": "0",
        "image_size": 224,
        "batch_size": 64,
        "epochs": 100,
        "lr": 1e-4,
        "patience": 5,
        "schedule": "constant",
    },
    # The fast offline demo: scikit-learn's 8x8 digits upscaled to 32 px.
    "digits-convnet": {
        "model": "convnet",
        "weights": "none",
        "image_size": 32,
        "batch_size": 32,
        "epochs": 5,
        "lr": 2e-3,
        "patience": 5,
    },
}


def preset_values(name: str) -> Dict[str, Any]:
    """The option values of a preset (a copy).

    Raises:
        ValueError: no preset of that name.
    """
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None
