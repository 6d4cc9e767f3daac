"""The bench plan, figures and report: pure functions, no pool and no torch."""

from __future__ import annotations

import json

import pytest

from gpupool.bench import figures
from gpupool.bench.plan import (
    Kind,
    Settings,
    job_name,
    job_specs,
    jobs_for_fraction,
    most_concurrent,
    parse_counts,
    parse_fractions,
    scaling_runs,
    share_runs,
)
from gpupool.bench.report import markdown, write_all
from gpupool.core.errors import InvalidInput
from gpupool.jobs.plan import gang_claim
from gpupool.jobs.spec import MAX_NAME


def test_counts_and_fractions_parse_and_name_the_fix():
    assert parse_counts("4, 1,2,2") == (1, 2, 4)
    with pytest.raises(InvalidInput, match="--gpus 1,2,4,8"):
        parse_counts("one")
    with pytest.raises(InvalidInput, match=">= 1"):
        parse_counts("0,1")
    # The whole-GPU job every share is compared with always runs, first.
    assert parse_fractions("0.25,0.5") == (1.0, 0.5, 0.25)
    assert parse_fractions("50%") == (1.0, 0.5)
    with pytest.raises(InvalidInput, match=r"outside \(0, 1\]"):
        parse_fractions("1.5")
    assert [jobs_for_fraction(f) for f in (1.0, 0.5, 0.3, 0.25)] == [1, 2, 3, 4]


def test_scaling_is_one_gang_per_count_spread_over_whole_gpus():
    runs = scaling_runs((1, 2, 4))
    assert [(r.label, r.workers, r.jobs) for r in runs] == [("gpus=1", 1, 1), ("gpus=2", 2, 1), ("gpus=4", 4, 1)]
    specs = job_specs(Settings(model="convnet"), runs[2], "bench-abc123", "/tmp/out/runs/g4", 4)
    assert len(specs) == 1
    spec = specs[0]
    assert spec.name == "bench-abc123-g4" and spec.framework.value == "pytorch"
    claim = gang_claim(spec)
    assert claim is not None and claim.policy.value == "spread"
    assert [(r.count, r.fraction) for r in claim.requests] == [(1, 1.0)] * 4
    command = spec.roles[0].command
    assert command[:3] == ("python", "-m", "gpupool.bench.worker")
    assert command[command.index("--concurrent") + 1] == "4"
    assert "--data" not in command  # synthetic by default


def test_share_is_one_job_per_slice_packed_on_one_gpu():
    runs = share_runs(parse_fractions("0.5,0.25"), gpu_index=1)
    assert [(r.label, r.jobs, r.key) for r in runs] == [
        ("fraction=1", 1, "f100"),
        ("fraction=0.5", 2, "f50"),
        ("fraction=0.25", 4, "f25"),
    ]
    assert most_concurrent(runs) == 4
    settings = Settings(model="convnet", data="/data/digits", amp=False, channels_last=True)
    specs = job_specs(settings, runs[2], "bench-abc123", "/out/runs/f25", 4)
    assert [s.name for s in specs] == [f"bench-abc123-f25-j{j}" for j in range(4)]
    for j, spec in enumerate(specs):
        claim = gang_claim(spec)
        assert claim is not None and claim.policy.value == "binpack"
        (request,) = claim.requests
        assert request.fraction == 0.25 and [f.to_text() for f in request.filters] == ["device.index=1"]
        command = spec.roles[0].command
        assert command[command.index("--tag") + 1] == f"j{j}"
        assert command[command.index("--peers") + 1] == "4"
        assert {"--data", "/data/digits", "--no-amp", "--channels-last"} <= set(command)
    odd = share_runs((0.125,))[0]
    assert len(job_name("bench-abc123", odd, 7)) <= MAX_NAME


def _result(tag: str, rank: int, seconds: float, steps, images: int, rss: float = 100.0) -> dict:
    return {
        "tag": tag,
        "rank": rank,
        "images": images,
        "seconds": seconds,
        "step_seconds": steps,
        "visible_devices": f"GPU-{rank}",
        "memory": {"max_rss_mib": rss, "gpu_used_mib": None, "gpu_reserved_mib": None},
    }


def test_a_data_parallel_job_is_paced_by_its_slowest_rank():
    assert figures.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert figures.percentile([1.0], 95) == 1.0
    job = figures.job_figures(
        [_result("job", 0, 1.0, [0.1, 0.1, 0.3], 300), _result("job", 1, 2.0, [0.2, 0.2, 0.2], 300, rss=150.0)]
    )
    assert job["images_per_second"] == 300.0  # 600 images over the slower rank's 2 s
    assert job["images_per_second_per_worker"] == 150.0
    assert job["step_p50_ms"] == 200.0  # per step, the slower rank: 0.2, 0.2, 0.3
    assert job["max_rss_mib"] == 150.0 and job["gpu_memory_mib"] is None
    base = figures.job_figures([_result("job", 0, 1.0, [0.1] * 3, 200)])
    row = figures.scaling_row(scaling_runs((2,))[0], job, base)
    assert row["speedup"] == 1.5 and row["efficiency"] == 0.75


def test_sharing_figures_compare_with_one_whole_gpu_job():
    run = share_runs((0.5,))[0]
    jobs = [
        figures.job_figures([_result("j0", 0, 1.0, [0.1], 60)]),
        figures.job_figures([_result("j1", 0, 1.0, [0.1], 40)]),
    ]
    row = figures.share_row(run, jobs, whole=80.0)
    assert row["images_per_second"] == 100.0
    assert row["aggregate_vs_whole"] == 1.25
    assert row["slowdown"] == [1.333, 2.0]
    assert row["fairness"] == 0.667


def test_report_files(tmp_path):
    job = figures.job_figures([_result("job", 0, 1.0, [0.1] * 3, 300)])
    rows = [
        {"label": "gpus=1", **figures.scaling_row(scaling_runs((1,))[0], job, job)},
        {"label": "gpus=2", "gpus": 2, "fraction": 1.0, "jobs": 1, "error": "job bench-x-g2 failed: exit 1"},
    ]
    report = {
        "kind": Kind.SCALING.value,
        "settings": Settings(model="convnet", image_size=32).to_dict(),
        "machine": {"accelerator": "CPU", "cpus": 2, "torch": "2.x", "amp": None},
        "runs": rows,
    }
    files = write_all(report, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["runs"][0]["images_per_second"] == 300.0
    text = markdown(report)
    assert "| 1 | 1 | 300.0 | 300.0 | 1.00 | 1.00 |" in text
    assert "failed: job bench-x-g2 failed" in text
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert set(files) == {"json", "markdown", "plot"}
