"""The ImageNet helper on a miniature ILSVRC2012 layout (real JPEGs, real tars)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Dict

import pytest

pytest.importorskip("PIL")

from gpupool.core.errors import InvalidInput
from gpupool.train.imagenet import extract_synsets, parse_synsets

SYNSETS = ["n01440764", "n01514668", "n02119022"]


def _jpeg(value: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (20, 16), (value, 0, 0)).save(buf, format="JPEG")
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _class_tar(synset: str, n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(n):
            _add(tar, f"{synset}_{i}.JPEG", _jpeg(i * 10))
        _add(tar, "../../escape.JPEG", _jpeg(1))  # must land inside the class folder, by base name
    return buf.getvalue()


def _make_layouts(tmp: Path) -> Dict[str, Path]:
    per_class = tmp / "per_class"
    per_class.mkdir()
    for synset in SYNSETS:
        (per_class / f"{synset}.tar").write_bytes(_class_tar(synset, 3))
    (per_class / "LOC_synset_mapping.txt").write_text("n01440764 tench, Tinca tinca\nn01514668 cock\n")
    outer = tmp / "outer"
    outer.mkdir()
    with tarfile.open(outer / "ILSVRC2012_img_train.tar", "w") as tar:
        for synset in SYNSETS + ["n09999999"]:
            _add(tar, f"{synset}.tar", _class_tar(synset, 2))
    folders = tmp / "folders" / "train"
    for synset in SYNSETS:
        (folders / synset).mkdir(parents=True)
        (folders / synset / f"{synset}_0.JPEG").write_bytes(_jpeg(5))
    return {"per_class": per_class, "outer": outer, "folders": tmp / "folders"}


def test_extracts_from_every_layout(tmp_path: Path) -> None:
    layouts = _make_layouts(tmp_path)
    counts = extract_synsets(layouts["per_class"], SYNSETS[:2], tmp_path / "a")
    assert counts == {"n01440764": 4, "n01514668": 4}
    assert sorted(p.name for p in (tmp_path / "a" / "n01440764").iterdir())[:2] == ["escape.JPEG", "n01440764_0.JPEG"]
    assert not (tmp_path / "escape.JPEG").exists()
    assert json.loads((tmp_path / "a" / "synsets.json").read_text())["n01440764"] == "tench, Tinca tinca"
    assert extract_synsets(layouts["outer"], SYNSETS, tmp_path / "b") == dict.fromkeys(SYNSETS, 3)
    assert not (tmp_path / "b" / "n09999999").exists()
    assert extract_synsets(layouts["folders"], SYNSETS, tmp_path / "c", limit=1) == dict.fromkeys(SYNSETS, 1)


def test_missing_synset_and_bad_ids(tmp_path: Path) -> None:
    layouts = _make_layouts(tmp_path)
    with pytest.raises(InvalidInput, match="n02489166 not found"):
        extract_synsets(layouts["per_class"], ["n01440764", "n02489166"], tmp_path / "x")
    with pytest.raises(InvalidInput, match="not an ImageNet synset"):
        parse_synsets("n01440764,tench")
    with pytest.raises(InvalidInput, match="at least two"):
        parse_synsets("n01440764")
    assert parse_synsets("n02489166, n01440764,n01514668,n02119022") == [
        "n02489166",
        "n01440764",
        "n01514668",
        "n02119022",
    ]


@pytest.mark.slow
@pytest.mark.torch
def test_extracted_synsets_train_and_predict_with_names(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    from gpupool.cli.main import main

    src = tmp_path / "src"
    src.mkdir()
    for k, synset in enumerate(SYNSETS):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(20):  # one colour per class: learnable in two epochs
                colour = [40, 40, 40]
                colour[k] = 200 + i
                from PIL import Image

                img = io.BytesIO()
                Image.new("RGB", (40, 30), tuple(colour)).save(img, format="JPEG")
                _add(tar, f"{synset}_{i}.JPEG", img.getvalue())
        (src / f"{synset}.tar").write_bytes(buf.getvalue())
    (src / "synset_words.txt").write_text("n01440764 tench\nn01514668 cock\nn02119022 red fox\n")
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["data", "imagenet", "--from", str(src), "--synsets", ",".join(SYNSETS), "--to", str(data)]) == 0
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(run),
                "--model",
                "convnet",
                "--image-size",
                "16",
                "--epochs",
                "2",
                "--batch-size",
                "8",
                "--workers",
                "0",
            ]
        )
        == 0
    )
    capsys.readouterr()
    report = json.loads((run / "report.json").read_text())
    assert report["class_names"]["n02119022"] == "red fox" and report["classes"] == SYNSETS
    photo = sorted((data / "n02119022").iterdir())[0]
    assert main(["predict", "--model", str(run), str(photo), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)[0]
    assert answer["class"] in SYNSETS and "name" in answer["top"][0]
