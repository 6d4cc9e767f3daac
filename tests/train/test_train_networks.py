"""Backbones, the vgg19-transfer layer stack, freezing, weights files and size limits."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402

from gpupool.core.errors import InvalidInput  # noqa: E402
from gpupool.train.config import build_config  # noqa: E402
from gpupool.train.networks import WEIGHT_URLS, build_model, count_parameters  # noqa: E402


def _from_config(cfg, num_classes: int):  # type: ignore[no-untyped-def]
    return build_model(
        cfg.model,
        num_classes,
        cfg.image_size,
        weights=cfg.weights,
        train_last=cfg.train_last,
        head=cfg.head,
        hidden=cfg.hidden,
        dropout=cfg.dropout,
    )


def test_vgg19_transfer_preset_builds_the_published_stack() -> None:
    cfg = build_config("d", "o", preset="vgg19-transfer", overrides={"weights": "none"})
    model = _from_config(cfg, num_classes=4)
    # Backbone: VGG19's 16 convolutions and 5 max-pools, no avgpool, no classifier
    # (Keras' VGG19(include_top=False)), all frozen as the preset says (train_last 0).
    convs = [m for m in model.backbone if isinstance(m, nn.Conv2d)]
    pools = [m for m in model.backbone if isinstance(m, nn.MaxPool2d)]
    assert len(convs) == 16 and len(pools) == 5
    assert not any(p.requires_grad for p in model.backbone.parameters())
    # Head: Flatten -> Dropout 0.5 -> Dense 30 ReLU -> Dense K.
    kinds = [type(m) for m in model.head]
    assert kinds == [nn.Flatten, nn.Dropout, nn.Linear, nn.ReLU, nn.Linear]
    assert model.head[1].p == 0.5
    assert (model.head[2].in_features, model.head[2].out_features) == (512 * 7 * 7, 30)
    assert (model.head[4].in_features, model.head[4].out_features) == (30, 4)
    assert all(p.requires_grad for p in model.head.parameters())
    # The recipe around it.
    assert (cfg.lr, cfg.batch_size, cfg.epochs, cfg.patience, cfg.image_size) == (1e-4, 64, 100, 5, 224)


@pytest.mark.parametrize("name,size", [("resnet18", 32), ("convnet", 8), ("convnet", 32), ("vgg16", 32)])
def test_models_produce_logits(name: str, size: int) -> None:
    model = build_model(name, 3, size, weights="none").eval()
    with torch.no_grad():
        assert model(torch.zeros(2, 3, size, size)).shape == (2, 3)


def test_train_last_counts_backbone_layers() -> None:
    model = build_model("resnet18", 5, 32, weights="none", train_last="2")
    trainable_units = [u for u in model.units if any(p.requires_grad for p in u.parameters())]
    assert trainable_units == model.units[-2:]  # the last two residual blocks
    model.train()
    assert not model.units[0].training  # frozen BatchNorm stays in eval mode
    assert model.units[-1].training
    everything = build_model("resnet18", 5, 32, weights="none", train_last="all")
    assert count_parameters(everything)["trainable"] == count_parameters(everything)["total"]
    frozen = build_model("resnet18", 5, 32, weights="none", train_last="0")
    assert count_parameters(frozen)["trainable"] == 512 * 5 + 5


def test_weights_are_loaded_from_a_local_file(tmp_path: Path) -> None:
    import torchvision

    torch.manual_seed(3)
    reference = torchvision.models.resnet18(weights=None)
    path = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), path)
    model = build_model("resnet18", 4, 32, weights=str(path))
    assert torch.equal(model.units[0][0].weight, reference.conv1.weight)
    assert torch.equal(model.units[-1].conv2.weight, reference.layer4[1].conv2.weight)
    # Pretrained: the backbone is frozen by default, only the new head trains.
    assert count_parameters(model)["trainable"] == 512 * 4 + 4


def test_missing_or_wrong_weights_say_where_to_get_them(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as err:
        build_model("vgg19", 4, 224, weights=str(tmp_path / "vgg19.pth"))
    assert WEIGHT_URLS["vgg19"] in err.value.message and "--weights none" in err.value.message
    with pytest.raises(InvalidInput, match="--weights none"):
        build_model("resnet50", 4, 224, weights=None)
    bad = tmp_path / "bad.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, bad)
    with pytest.raises(InvalidInput, match="does not fit resnet18"):
        build_model("resnet18", 4, 32, weights=str(bad))


def test_image_too_small_for_the_model() -> None:
    with pytest.raises(InvalidInput, match="too small for vgg19"):
        build_model("vgg19", 4, 16, weights="none")
    with pytest.raises(InvalidInput, match="too small for convnet"):
        build_model("convnet", 4, 4)


def test_unreadable_model_file_is_a_short_invalid_input(tmp_path: Path) -> None:
    from gpupool.train.export import load_serving

    junk = tmp_path / "model.pt"
    junk.write_text("# not a model\n")
    with pytest.raises(InvalidInput) as err:
        load_serving(tmp_path)
    assert str(junk) in err.value.message and "gpupool train" in err.value.message
    assert "weights_only" not in err.value.message  # torch's advice to load unsafely is not passed on
