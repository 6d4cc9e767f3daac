"""The trainer on a bucket (issue 26's done-when): the digits demo reads s3://bucket/digits and writes
s3://bucket/run1 on a local S3 server, is killed with kill -9 mid-epoch, and the rerun (on a fresh
cache, as on another node) resumes from the bucket's checkpoint and ends like an unbroken run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytestmark = pytest.mark.torch

from gpupool_cli import gpupool_cmd  # noqa: E402
from waiting import cpu_seconds, wait_until  # noqa: E402

from gpupool.train import storage  # noqa: E402
from gpupool.train.bucket_data import BucketFiles  # noqa: E402
from gpupool.train.run_place import CHECKPOINTS, RunPlace, newest_first, series_name  # noqa: E402

from .conftest import REPO, run_env, run_gpupool  # noqa: E402

ARGS = ["--model", "convnet", "--image-size", "32", "--workers", "1", "--epochs", "3", "--batch-size", "4"]
ARGS += ["--patience", "50"]


def _report(url: str) -> dict:
    return json.loads(storage.read_bytes(url + "/report.json"))


def _checkpoints(url: str) -> list:
    return newest_first(storage.listdir(storage.join(url, CHECKPOINTS)))


@pytest.fixture(scope="module")
def digits_600(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 digits per class: an epoch of some 100 steps, long enough to be killed inside."""
    pytest.importorskip("sklearn")
    from gpupool.train.digits import export_digits

    root = tmp_path_factory.mktemp("digits_600")
    export_digits(root, limit_per_class=60)
    return root


@pytest.mark.slow
def test_kill_9_mid_epoch_then_resume_from_the_bucket_ends_like_an_unbroken_run(
    digits_600: Path, s3_bucket: str, tmp_path: Path
) -> None:
    data = s3_bucket + "/digits"
    storage.put_tree(digits_600, data)
    args = ["--data", data, *ARGS]

    unbroken = run_gpupool("train", *args, "--out", s3_bucket + "/unbroken", "--cache-dir", str(tmp_path / "node-a"))
    assert unbroken.returncode == 0, unbroken.stderr

    run1 = s3_bucket + "/run1"
    proc = subprocess.Popen(
        gpupool_cmd("train", *args, "--out", run1, "--cache-dir", str(tmp_path / "node-a")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=run_env(),
        start_new_session=True,
    )
    wait_until(lambda: _checkpoints(run1) or proc.poll() is not None, 180, "the first epoch's checkpoint")
    assert _checkpoints(run1) == [series_name(1, 0)], "the first epoch's checkpoint never reached the bucket"
    # into epoch 2's steps: 0.5 s of the trainer's own CPU time on (a loaded machine gives it less per second)
    since = cpu_seconds(proc.pid)
    wait_until(lambda: cpu_seconds(proc.pid) >= since + 0.5, 120, "the trainer into epoch 2", interval=0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _checkpoints(run1) == [series_name(1, 0)], "killed too late: epoch 2 had finished"
    assert not storage.exists(run1 + "/report.json")

    # What a replica killed mid-write could leave: a temporary object and a torn newer checkpoint.
    # Resume takes neither.
    folder = storage.join(run1, CHECKPOINTS)
    storage.write_bytes(storage.join(folder, series_name(1, 40)), b"torn")
    fs, inner = storage.filesystem(storage.join(folder, ".tmp-" + series_name(2, 0) + ".123.abcd"))
    fs.pipe_file(inner, b"half a checkpoint")

    # Another node: an empty cache; everything comes from the bucket.
    rerun = run_gpupool("train", *args, "--out", run1, "--cache-dir", str(tmp_path / "node-b"))
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming {run1} after epoch 1" in rerun.stderr, rerun.stderr
    report, reference = _report(run1), _report(s3_bucket + "/unbroken")
    assert report["epochs_run"] == reference["epochs_run"] == 3
    assert report["test_accuracy"] == reference["test_accuracy"]
    rows = [json.loads(line) for line in storage.read_text(run1 + "/metrics.jsonl").splitlines() if line]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    # The newest three are kept (the torn one among them until newer ones push it out).
    assert _checkpoints(run1) == [series_name(3, 0), series_name(2, 0), series_name(1, 40)]
    files = storage.find(run1)
    assert {"report.json", "model.pt", "split.json", "config.json"} <= set(files)

    # predict reads the model and the images from the bucket
    image = f"{data}/{report['classes'][3]}/{storage.find(data + '/' + report['classes'][3])[0]}"
    predicted = run_gpupool("predict", "--model", run1, image, "--json", "--device", "cpu")
    assert predicted.returncode == 0, predicted.stderr
    assert json.loads(predicted.stdout)[0]["file"] == image


def test_gpupool_data_writes_to_a_bucket(s3_bucket: str) -> None:
    pytest.importorskip("sklearn")
    made = run_gpupool("data", "digits", "--to", s3_bucket + "/digits", "--limit-per-class", "3")
    assert made.returncode == 0, made.stderr
    files = storage.find(s3_bucket + "/digits")
    assert len(files) == 30 and files[0].startswith("0/")
    missing = run_gpupool("data", "digits", "--to", "s3://no-such-bucket-zz/digits", "--limit-per-class", "3")
    assert missing.returncode == 2 and "the bucket does not exist" in missing.stderr, missing.stderr


def test_resume_skips_a_torn_checkpoint(s3_bucket: str, tmp_path: Path) -> None:
    place = RunPlace.for_out(s3_bucket + "/run", tmp_path, rank=0, keep=2)
    place.pull()
    folder = storage.join(place.url or "", CHECKPOINTS)
    local = tmp_path / "good.pt"
    torch.save({"epoch": 4, "config": {}}, local)
    storage.put_file(local, storage.join(folder, series_name(4, 0)))
    storage.write_bytes(storage.join(folder, series_name(5, 0)), b"not a checkpoint")
    ckpt = place.load_checkpoint()
    assert ckpt is not None and ckpt["epoch"] == 4


def test_a_run_started_over_drops_the_earlier_series(s3_bucket: str, tmp_path: Path) -> None:
    place = RunPlace.for_out(s3_bucket + "/again", tmp_path, rank=0)
    folder = storage.join(s3_bucket + "/again", CHECKPOINTS)
    storage.write_bytes(storage.join(folder, series_name(7, 0)), b"an earlier run's epoch 7")
    place.forget_checkpoints()
    assert storage.listdir(folder) == []


def test_no_checkpoint_in_an_empty_bucket_run(s3_bucket: str, tmp_path: Path) -> None:
    place = RunPlace.for_out(s3_bucket + "/fresh", tmp_path, rank=0)
    place.pull()
    assert place.load_checkpoint() is None


def test_the_data_cache_stays_bounded_and_lists_once(s3_bucket: str, tmp_path: Path, monkeypatch) -> None:
    for c in ("a", "b"):
        for i in range(10):
            storage.write_bytes(f"{s3_bucket}/set/{c}/{i}.png", os.urandom(10_000))
    bucket = BucketFiles(s3_bucket + "/set", tmp_path, max_bytes=50_000)
    listings = []
    real_find = storage.find
    monkeypatch.setattr(storage, "find", lambda url: listings.append(url) or real_find(url))
    classes, samples = bucket.scan()
    assert classes == ["a", "b"] and len(samples) == 20 and len(listings) == 1
    for _ in range(2):  # two "epochs"
        for rel, _ in samples:
            with open(bucket.local(rel), "rb") as f:
                assert len(f.read()) == 10_000
    cached = sum(p.stat().st_size for p in bucket.cache.rglob("*") if p.is_file())
    # the size, plus at most one tenth of it added between checks
    assert cached <= 55_000
    assert len(listings) == 1


def test_bad_bucket_urls_are_one_line_errors_exit_2(s3_bucket: str, tmp_path: Path) -> None:
    cache = ["--cache-dir", str(tmp_path)]
    missing = run_gpupool("train", "--data", s3_bucket + "/x", "--out", "s3://no-such-bucket-zz/run", *ARGS, *cache)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "gpupool: error: s3://no-such-bucket-zz/run: the bucket does not exist; create it or fix the URL"
    )
    empty = run_gpupool("train", "--data", s3_bucket + "/none", "--out", s3_bucket + "/run", *ARGS, *cache)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1, empty.stderr
    assert f"{s3_bucket}/none does not exist" in empty.stderr
    scheme = run_gpupool("train", "--data", "hdfs2://x/y", "--out", str(tmp_path / "r"), *ARGS, *cache)
    assert scheme.returncode == 2 and "unknown scheme 'hdfs2'" in scheme.stderr, scheme.stderr


def test_the_benchmark_runs_and_writes_its_ratio(tmp_path: Path) -> None:
    pytest.importorskip("moto.server")
    out = tmp_path / "objstore.json"
    args = ["--images", "16", "--width", "64", "--height", "48", "--size", "32", "--rounds", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_objstore.py"), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=run_env(),
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["ratio"] > 0 and result["bucket_cold_images_per_second"] > 0 and result["target_ratio"] == 0.8
