"""Class-folder scanning, the seeded split, decoding and the skip-and-count of bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytestmark = pytest.mark.torch

from gpupool.core.errors import InvalidInput  # noqa: E402
from gpupool.train.data import (  # noqa: E402
    BAD_LABEL,
    SPLIT_FILE,
    ImageFiles,
    load_or_make_split,
    make_loader,
    make_split,
    scan_class_folders,
)


def _png(path: Path, value: int = 128, size: int = 12) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), (value, value, value)).save(path)


def test_empty_and_single_class_folders_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="does not exist"):
        scan_class_folders(tmp_path / "missing")
    (tmp_path / "a").mkdir()
    with pytest.raises(InvalidInput, match="no images"):
        scan_class_folders(tmp_path)
    _png(tmp_path / "a" / "1.png")
    with pytest.raises(InvalidInput, match="single class"):
        scan_class_folders(tmp_path)


def test_scan_accepts_jpg_jpeg_png_any_case(tmp_path: Path) -> None:
    for name in ("a/x.jpg", "a/y.JPEG", "b/z.png", "b/notes.txt"):
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    classes, samples = scan_class_folders(tmp_path)
    assert classes == ["a", "b"]
    assert sorted(p for p, _ in samples) == ["a/x.jpg", "a/y.JPEG", "b/z.png"]


def test_split_is_seeded_stratified_and_complete() -> None:
    samples = [(f"c{c}/{i}.png", c) for c in range(3) for i in range(100)]
    a = make_split(["c0", "c1", "c2"], samples, (0.7, 0.15, 0.15), seed=7)
    b = make_split(["c0", "c1", "c2"], list(reversed(samples)), (0.7, 0.15, 0.15), seed=7)
    c = make_split(["c0", "c1", "c2"], samples, (0.7, 0.15, 0.15), seed=8)
    assert a == b  # listing order does not matter
    assert a.train != c.train  # the seed does
    assert (len(a.train), len(a.val), len(a.test)) == (210, 45, 45)
    assert sorted(a.train + a.val + a.test) == sorted(samples)
    for part in (a.val, a.test):
        assert {cls for _, cls in part} == {0, 1, 2}


def test_split_is_written_and_reused(small_digits_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = load_or_make_split(small_digits_dir, run, (0.7, 0.15, 0.15), 0, write=True)
    assert (run / SPLIT_FILE).exists()
    # A different seed on re-run still gets the recorded split: the run dir owns it.
    again = load_or_make_split(small_digits_dir, run, (0.5, 0.25, 0.25), 99, write=True)
    assert again == first
    assert json.loads((run / SPLIT_FILE).read_text())["classes"] == [str(d) for d in range(10)]


def test_corrupt_files_become_ignored_samples(tmp_path: Path) -> None:
    _png(tmp_path / "a" / "good.png", size=40)
    (tmp_path / "a" / "garbage.jpg").write_bytes(b"this is not a jpeg")
    (tmp_path / "a" / "empty.png").write_bytes(b"")
    good = (tmp_path / "a" / "good.png").read_bytes()
    (tmp_path / "a" / "truncated.png").write_bytes(good[: len(good) // 2])
    samples = [("a/good.png", 0), ("a/garbage.jpg", 0), ("a/empty.png", 0), ("a/truncated.png", 0)]
    ds = ImageFiles(tmp_path, samples, size=16)
    items = [ds[i] for i in range(len(ds))]
    assert items[0][0].shape == (3, 16, 16) and items[0][0].dtype == torch.uint8 and items[0][1] == 0
    assert [label for _, label, _ in items[1:]] == [BAD_LABEL] * 3
    assert all(img.shape == (3, 16, 16) for img, _, _ in items)


def test_loader_with_persistent_workers(small_digits_dir: Path) -> None:
    classes, samples = scan_class_folders(small_digits_dir)
    ds = ImageFiles(small_digits_dir, samples[:64], size=32)
    loader, sampler = make_loader(ds, 16, workers=1, pin_memory=False, shuffle=True, seed=0, rank=0, world_size=1)
    assert loader.persistent_workers and loader.num_workers == 1
    seen = []
    for epoch in (1, 2):
        sampler.set_epoch(epoch)
        seen.append([int(i) for _, _, idx in loader for i in idx])
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(64))
    assert seen[0] != seen[1]  # reshuffled per epoch, deterministically


def test_eval_shards_cover_everything_once(small_digits_dir: Path) -> None:
    _, samples = scan_class_folders(small_digits_dir)
    ds = ImageFiles(small_digits_dir, samples[:25], size=8)
    got = []
    for rank in range(2):
        loader, _ = make_loader(ds, 4, 0, False, False, 0, rank, 2)
        got += [int(i) for _, _, idx in loader for i in idx]
    assert sorted(got) == list(range(25))


def test_split_properties_hold_for_any_class_sizes() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(min_value=1, max_value=60), min_size=2, max_size=6), st.integers(0, 2**16))
    def check(sizes: list, seed: int) -> None:
        samples = [(f"c{c}/{i}.png", c) for c, n in enumerate(sizes) for i in range(n)]
        split = make_split([f"c{c}" for c in range(len(sizes))], samples, (0.7, 0.15, 0.15), seed)
        parts = split.train + split.val + split.test
        assert sorted(parts) == sorted(samples)  # a partition: nothing lost, nothing twice
        for c, n in enumerate(sizes):
            in_train = sum(1 for _, k in split.train if k == c)
            assert in_train >= 1  # every class is learnable
            if n >= 3:  # and, when it can be, validated and tested
                assert any(k == c for _, k in split.val) and any(k == c for _, k in split.test)

    check()


@pytest.mark.parametrize("workers", [0, 1])
def test_batches_match_single_items_bad_files_included(tmp_path: Path, workers: int) -> None:
    from PIL import Image

    for i in range(7):
        path = tmp_path / str(i % 2) / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        arr = torch.randint(0, 256, (10 + i, 14, 3), dtype=torch.uint8).numpy()  # not square, not 12 px
        Image.fromarray(arr).save(path)
    (tmp_path / "0" / "bad.jpg").write_bytes(b"not a jpeg")
    _, samples = scan_class_folders(tmp_path)
    ds = ImageFiles(tmp_path, samples, size=12)
    loader, _ = make_loader(ds, 3, workers, False, False, 0, 0, 1, persistent=False)
    got = list(loader)
    images = torch.cat([b[0] for b in got])
    labels = torch.cat([b[1] for b in got])
    index = torch.cat([b[2] for b in got])
    want = [ds[i] for i in range(len(ds))]
    assert index.tolist() == list(range(len(ds)))
    assert labels.tolist() == [label for _, label, _ in want] and BAD_LABEL in labels.tolist()
    assert images.shape == (len(ds), 3, 12, 12) and images.dtype == torch.uint8
    assert torch.equal(images, torch.stack([img for img, _, _ in want]))  # bad file: all zeros


def test_normalizer_matches_reference_in_both_layouts() -> None:
    from gpupool.train.data import MEAN, STD, Normalizer

    x = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    ref = (x.float() / 255.0 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    for channels_last in (False, True):
        y = Normalizer(channels_last)(x)
        assert y.dtype == torch.float32 and torch.allclose(y, ref, atol=1e-5)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        assert y.is_contiguous(memory_format=fmt)
    assert torch.allclose(Normalizer()(x.contiguous()), ref, atol=1e-5)
