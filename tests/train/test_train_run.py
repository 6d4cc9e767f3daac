"""End to end: `gpupool train` on real data, DDP on CPU, kill -9 and resume, bad files,
predict and export, and the exit-2 messages for bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytestmark = pytest.mark.torch

from envs import free_port  # noqa: E402
from gpupool_cli import gpupool_cmd  # noqa: E402
from waiting import wait_until  # noqa: E402

from gpupool.cli.main import main  # noqa: E402

from .conftest import run_env, run_gpupool  # noqa: E402

FAST = ["--model", "convnet", "--image-size", "32", "--workers", "0"]


def _report(run: Path) -> Dict[str, Any]:
    return json.loads((run / "report.json").read_text())


def _rows(run: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def digits_run(digits_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """One real training run on the full digits set, shared by the result tests."""
    out = tmp_path_factory.mktemp("runs") / "digits"
    proc = run_gpupool(
        "train",
        "--data",
        str(digits_dir),
        "--out",
        str(out),
        "--model",
        "convnet",
        "--image-size",
        "32",
        "--epochs",
        "4",
        "--batch-size",
        "32",
        "--workers",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    return {"out": out, "stdout": proc.stdout, "stderr": proc.stderr}


@pytest.mark.slow
def test_digits_reaches_90_percent(digits_run: Dict[str, Any]) -> None:
    out = digits_run["out"]
    report = _report(out)
    assert report["test_accuracy"] >= 0.90, report["test_accuracy"]
    assert report["epochs_run"] == 4 and len(_rows(out)) == 4
    assert report["best_val_accuracy"] >= 0.85
    assert report["images_per_second"] > 0
    assert len(report["per_class"]) == 10
    assert set(report["per_class"]["3"]) == {"precision", "recall", "f1", "support"}
    matrix = report["confusion_matrix"]
    assert len(matrix) == 10 and sum(map(sum, matrix)) == report["split_sizes"]["test"]
    assert report["corrupt_images"]["count"] == 0
    for name in (
        "learning_curves.png",
        "confusion_matrix.png",
        "model.pt",
        "model.torchscript.pt",
        "split.json",
        "checkpoint.pt",
        "config.json",
    ):
        assert (out / name).stat().st_size > 0, name
    last = digits_run["stdout"].strip().splitlines()[-1]
    assert last.startswith("test_accuracy=") and "images_per_second=" in last and "report=" in last


@pytest.mark.slow
def test_predict_prints_class_and_probability(
    digits_run: Dict[str, Any], digits_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    files = [str(sorted((digits_dir / d).iterdir())[0]) for d in ("0", "7")]
    assert main(["predict", "--model", str(digits_run["out"]), *files, "--json", "--top", "3"]) == 0
    answers = json.loads(capsys.readouterr().out)
    assert [a["file"] for a in answers] == files
    assert all(0.0 < a["probability"] <= 1.0 and len(a["top"]) == 3 for a in answers)
    assert [a["class"] for a in answers] == ["0", "7"]
    assert main(["predict", "--model", str(digits_run["out"]), files[0]]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{files[0]}: 0 ")


@pytest.mark.slow
def test_torchscript_export_serves_without_gpupool(digits_run: Dict[str, Any]) -> None:
    scripted = torch.jit.load(str(digits_run["out"] / "model.torchscript.pt"))
    probs = scripted(torch.zeros(2, 3, 32, 32, dtype=torch.uint8))
    assert probs.shape == (2, 10) and torch.allclose(probs.sum(1), torch.ones(2), atol=1e-4)


@pytest.mark.slow
def test_ddp_two_processes_match_single_process(small_digits_dir: Path, tmp_path: Path) -> None:
    args = ["--data", str(small_digits_dir), *FAST, "--epochs", "3", "--batch-size", "16", "--patience", "50"]
    single = run_gpupool("train", *args, "--out", str(tmp_path / "single"))
    assert single.returncode == 0, single.stderr
    out = tmp_path / "ddp"
    port = str(free_port())
    procs = [
        subprocess.Popen(
            gpupool_cmd("train", *args, "--out", str(out)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=run_env(
                {
                    "RANK": str(r),
                    "LOCAL_RANK": str(r),
                    "WORLD_SIZE": "2",
                    "LOCAL_WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                }
            ),
        )
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert outputs[0][0].strip().splitlines()[-1].startswith("test_accuracy=")
    assert outputs[1][0].strip() == ""  # rank 1 prints nothing, writes nothing
    report = _report(out)
    assert report["world_size"] == 2 and report["epochs_run"] == _report(tmp_path / "single")["epochs_run"] == 3
    assert [r["epoch"] for r in _rows(out)] == [1, 2, 3]
    assert sum(map(sum, report["confusion_matrix"])) == report["split_sizes"]["test"]
    assert (out / "split.json").read_text() == (tmp_path / "single" / "split.json").read_text()
    assert not list(out.glob(".*.tmp"))


@pytest.mark.slow
def test_kill_9_then_resume_finishes_like_an_unbroken_run(small_digits_dir: Path, tmp_path: Path) -> None:
    args = ["--data", str(small_digits_dir), *FAST, "--epochs", "6", "--batch-size", "8", "--patience", "50"]
    unbroken = run_gpupool("train", *args, "--out", str(tmp_path / "unbroken"))
    assert unbroken.returncode == 0, unbroken.stderr
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        gpupool_cmd("train", *args, "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=run_env(),
    )
    wait_until(lambda: (out / "metrics.jsonl").exists() and len(_rows(out)) >= 2, 120, "two epochs' rows")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "report.json").exists()
    done_before = len(_rows(out))
    assert 2 <= done_before < 6
    resumed = run_gpupool("train", *args, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    report, reference = _report(out), _report(tmp_path / "unbroken")
    assert report["epochs_run"] == reference["epochs_run"] == 6
    assert [r["epoch"] for r in _rows(out)] == [1, 2, 3, 4, 5, 6]
    assert (out / "split.json").read_text() == (tmp_path / "unbroken" / "split.json").read_text()
    # Same data order, same RNG, same optimizer state: CPU training lands on the same model.
    assert report["test_accuracy"] == reference["test_accuracy"]
    assert report["best_epoch"] == reference["best_epoch"]


@pytest.mark.slow
def test_corrupt_images_are_skipped_and_counted(small_digits_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(small_digits_dir, data)
    (data / "1" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (data / "2" / "empty.png").write_bytes(b"")
    good = next((data / "3").iterdir()).read_bytes()
    (data / "3" / "truncated.png").write_bytes(good[:20])
    out = tmp_path / "run"
    # One loader worker, persistent across both epochs: decoding happens in the worker.
    proc = run_gpupool(
        "train",
        "--data",
        str(data),
        "--out",
        str(out),
        "--model",
        "convnet",
        "--image-size",
        "16",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--workers",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    report = _report(out)
    assert report["corrupt_images"]["count"] == 3
    assert sorted(report["corrupt_images"]["files"]) == ["1/broken.jpg", "2/empty.png", "3/truncated.png"]
    assert report["epochs_run"] == 2


def _exit_and_message(argv: List[str], capsys: pytest.CaptureFixture) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_bad_input_exits_2_with_a_message(
    small_digits_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = str(tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no images" in _exit_and_message(["train", "--data", str(empty), "--out", out, *FAST], capsys)
    single = tmp_path / "single"
    shutil.copytree(small_digits_dir / "4", single / "4")
    assert "single class" in _exit_and_message(["train", "--data", str(single), "--out", out, *FAST], capsys)
    data = ["--data", str(small_digits_dir)]
    err = _exit_and_message(
        ["train", *data, "--out", out + "1", "--model", "resnet18", "--weights", "none", "--image-size", "16"], capsys
    )
    assert "too small for resnet18" in err
    err = _exit_and_message(
        ["train", *data, "--out", out + "2", "--preset", "vgg19-transfer", "--weights", str(tmp_path / "vgg19.pth")],
        capsys,
    )
    assert "vgg19-dcbb9e9d.pth" in err and "--weights none" in err
    err = _exit_and_message(["train", *data, "--out", out + "3", *FAST, "--batch-size", "100000"], capsys)
    assert "--batch-size 100000 is larger than the training set" in err
    assert "--epochs" in _exit_and_message(["train", *data, "--out", out, *FAST, "--epochs", "0"], capsys)
    assert "does not exist" in _exit_and_message(["predict", "--model", out, str(tmp_path / "x.jpg")], capsys)
    other = tmp_path / "other_run"
    other.mkdir()
    torch.save({"config": {"structural": {"model": "resnet50"}}}, other / "checkpoint.pt")
    err = _exit_and_message(["train", *data, "--out", str(other), *FAST], capsys)
    assert "checkpoint of a different run" in err and "--no-resume" in err


def test_data_digits_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["data", "digits", "--to", str(tmp_path / "d"), "--limit-per-class", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] == 30 and len(summary["classes"]) == 10
    assert len(list((tmp_path / "d" / "9").glob("*.png"))) == 3
