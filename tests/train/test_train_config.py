"""Configuration merging and validation (no torch needed)."""

from __future__ import annotations

import pytest

from gpupool.train.config import TrainConfig, build_config, parse_split
from gpupool.train.presets import PRESETS


def test_defaults_preset_then_flags() -> None:
    cfg = build_config("d", "o", preset="vgg19-transfer", overrides={"lr": 3e-4, "epochs": None})
    assert cfg.model == "vgg19" and cfg.head == "mlp" and cfg.hidden == 30 and cfg.dropout == 0.5
    assert cfg.lr == 3e-4  # the flag wins
    assert cfg.epochs == 100 and cfg.batch_size == 64 and cfg.patience == 5 and cfg.image_size == 224
    assert cfg.preset == "vgg19-transfer"


def test_plain_defaults_and_model_defaults() -> None:
    assert build_config("d", "o").lr == TrainConfig.lr
    assert build_config("d", "o", overrides={"model": "convnet"}).lr == 3e-3
    assert build_config("d", "o", overrides={"model": "convnet", "lr": 0.5}).lr == 0.5


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        ({"model": "alexnet"}, "unknown model"),
        ({"epochs": 0}, "--epochs"),
        ({"batch_size": 0}, "--batch-size"),
        ({"train_last": "some"}, "--train-last"),
        ({"dropout": 1.0}, "--dropout"),
    ],
)
def test_validation_names_the_flag(overrides: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        build_config("d", "o", overrides=overrides)


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="unknown preset"):
        build_config("d", "o", preset="nope")


def test_parse_split() -> None:
    assert parse_split("70/15/15") == pytest.approx((0.7, 0.15, 0.15))
    assert parse_split("0.8,0.1,0.1") == pytest.approx((0.8, 0.1, 0.1))
    for bad in ("70/30", "100/0/0", "a/b/c"):
        with pytest.raises(ValueError):
            parse_split(bad)


def test_presets_only_name_known_fields() -> None:
    for name in PRESETS:
        build_config("d", "o", preset=name)
