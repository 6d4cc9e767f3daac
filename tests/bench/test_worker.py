"""The bench worker in-process: folder data through the trainer's loaders, synthetic data,
the start line of concurrent jobs, and what it writes."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("torchvision")
pytestmark = pytest.mark.torch


@pytest.fixture
def no_dist_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def _digits(root: Path, per_class: int = 8) -> Path:
    """A tiny class-folder set of PNGs (3 classes)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(root / f"c{c}" / f"{i}.png")
    return root


def test_folder_data_through_the_trainers_loaders(tmp_path, no_dist_env):
    from gpupool.bench import worker

    data = _digits(tmp_path / "data")
    out = tmp_path / "run"
    args = ["--out", str(out), "--tag", "job", "--model", "convnet", "--image-size", "16", "--batch-size", "8"]
    assert worker.main([*args, "--data", str(data), "--steps", "5", "--warmup", "1", "--loader-workers", "0"]) == 0
    result = json.loads((out / "result-job-r0.json").read_text())
    assert result["data"] == str(data) and result["device"] == "cpu" and result["world_size"] == 1
    assert len(result["step_seconds"]) == 5 and all(s > 0 for s in result["step_seconds"])
    assert result["images"] == 5 * 8 and result["seconds"] >= sum(result["step_seconds"]) * 0.99
    assert result["memory"]["max_rss_mib"] > 0 and result["memory"]["gpu_used_mib"] is None
    assert json.loads((out / "progress-job.json").read_text()) == {"phase": "done", "step": 6, "of": 6}


def test_too_few_images_for_a_batch_is_refused(tmp_path, no_dist_env, capsys):
    from gpupool.bench import worker

    data = _digits(tmp_path / "data", per_class=2)
    args = ["--out", str(tmp_path / "run"), "--tag", "job", "--model", "convnet", "--image-size", "16"]
    assert worker.main([*args, "--data", str(data), "--batch-size", "64"]) == 2
    assert "lower --batch-size" in capsys.readouterr().err


def test_concurrent_jobs_start_together_and_hold_until_all_have_timed(tmp_path, no_dist_env):
    from gpupool.bench.worker import StartLine

    lines = [StartLine(tmp_path, f"j{i}", 2) for i in range(2)]
    with pytest.raises(SystemExit, match="only 1 of 2 jobs reached the start line"):
        lines[0].arrive(timeout_s=0.2)
    arrived = threading.Event()
    t = threading.Thread(target=lambda: (lines[1].arrive(60.0), arrived.set()))
    t.start()
    t.join(60)
    assert arrived.is_set()
    lines[0].finish()
    assert not lines[1].all_done()
    lines[1].finish()
    assert lines[0].all_done() and lines[1].all_done()
