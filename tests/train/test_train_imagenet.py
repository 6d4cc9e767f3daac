"""The ImageNet helper on a miniature ILSVRC2012 layout (real JPEGs, real tars)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Dict

import pytest

pytest.importorskip("PIL")

from gpupool.core.errors import InvalidInput  # noqa: E402
from gpupool.train.imagenet import extract_synsets, parse_synsets  # noqa: E402

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
    assert extract_synsets(layouts["outer"], SYNSETS, tmp_path / "b") == {s: 3 for s in SYNSETS}
    assert not (tmp_path / "b" / "n09999999").exists()
    assert extract_synsets(layouts["folders"], SYNSETS, tmp_path / "c", limit=1) == {s: 1 for s in SYNSETS}


def test_missing_synset_and_bad_ids(tmp_path: Path) -> None:
    layouts = _make_layouts(tmp_path)
    with pytest.raises(InvalidInput, match="n02489166 not found"):
        extract_synsets(layouts["per_class"], ["n01440764", "n02489166"], tmp_path / "x")
    with pytest.raises(InvalidInput, match="not an ImageNet synset"):
        parse_synsets("n01440764,tench")
    with pytest.raises(InvalidInput, match="at least two"):
        parse_synsets("n01440764")
    assert parse_synsets("n02489166, n01440764,n01514668,n02119022") == [
        "n02489166", "n01440764", "n01514668", "n02119022"]
