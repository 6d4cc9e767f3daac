"""`gpupool bench isolation`'s figures and report, on recorded samples (no GPU, no torch)."""

from __future__ import annotations

import pytest

from gpupool.bench.isolation import figures
from gpupool.bench.isolation.caps import outcome, summarize
from gpupool.bench.isolation.harness import markdown


def work(rates, step=0.05):
    """A cumulative work series from [(start, end, rate per s), ...] pieces, sampled every `step`."""
    out, done = [], 0.0
    for start, end, r in rates:
        t = start
        if not out:
            out.append((t, done))
        while t + step <= end + 1e-9:
            t += step
            done += r * step
            out.append((round(t, 6), done))
    return out


def test_a_split_that_holds_and_settles_at_once():
    first = work([(0, 5, 100.0), (5, 35, 10.0)])
    second = work([(5, 35, 90.0)])
    row = figures.split(first, second, 0.1, 0.9)
    assert row["asked_ratio"] == pytest.approx(9)
    assert row["delivered_ratio"] == pytest.approx(9, rel=1e-3)
    assert row["holds"] and abs(row["error"]) < 1e-3
    assert row["first_alone_rate"] == pytest.approx(100, rel=1e-3)
    assert row["settle_s"] == 0
    assert row["window_s"] == pytest.approx(30, abs=0.1)


def test_a_split_that_misses_is_said_to_miss():
    # HAMi's 10/90 delivered 1:6-8: here 1:6.
    first = work([(0, 30, 12.5)])
    second = work([(0, 30, 75.0)])
    row = figures.split(first, second, 0.1, 0.9)
    assert row["delivered_ratio"] == pytest.approx(6, rel=1e-3)
    assert not row["holds"]
    assert row["error"] == pytest.approx(6 / 9 - 1, abs=1e-3)


def test_settling_is_the_time_until_the_ratio_stays_put():
    # Both at the same pace for 2 s after the second starts, then 1:3 for good.
    first = work([(0, 2, 50.0), (2, 20, 25.0)])
    second = work([(0, 2, 50.0), (2, 20, 75.0)])
    row = figures.split(first, second, 0.25, 0.75)
    assert row["settle_s"] == pytest.approx(2, abs=figures.SETTLE_STEP_S + 1e-9)
    # The window's ratio includes the unsettled start: a little under 3.
    assert 2.5 < row["delivered_ratio"] < 3


def test_a_split_that_never_settles_says_never():
    pieces = [(t, t + 1, 10.0 if t % 2 else 30.0) for t in range(20)]
    first = work([(0, 20, 10.0)])
    second = work(pieces)
    assert figures.split(first, second, 0.5, 0.5)["settle_s"] is None


def test_series_that_do_not_overlap_are_refused():
    with pytest.raises(ValueError, match="do not overlap"):
        figures.common_window(work([(0, 5, 1.0)]), work([(6, 9, 1.0)]))


def test_alone_against_the_whole_gpu():
    row = figures.alone(work([(0, 10, 25.0)]), whole_gpu_rate=100.0)
    assert row["rate"] == pytest.approx(25, rel=1e-3)
    assert row["of_whole_gpu"] == pytest.approx(0.25, rel=1e-3)


def test_latency_percentiles_and_window():
    series = [(float(i), (i + 1) / 1000) for i in range(100)]  # 1..100 ms
    lat = figures.latencies(series)
    assert lat["requests"] == 100
    assert lat["p50_ms"] == pytest.approx(50.5)
    assert lat["p99_ms"] == pytest.approx(99.01)
    assert figures.latencies(series, 10, 19)["requests"] == 10


def test_neighbour_against_each_alone():
    inference_alone = [(t / 10, 0.004) for t in range(100)]
    trainer_alone = work([(0, 10, 1000.0)])
    # Beside the trainer: 1 request in 20 takes 6 ms instead of 4; the trainer slows to 850/s.
    inference_beside = [(20 + t / 10, 0.006 if t % 20 == 0 else 0.004) for t in range(100)]
    trainer_beside = work([(18, 32, 850.0)])
    row = figures.neighbour(inference_alone, trainer_alone, inference_beside, trainer_beside)
    assert row["inference_alone"]["p99_ms"] == pytest.approx(4)
    assert row["inference_beside"]["p99_ms"] == pytest.approx(6)
    assert row["p99_vs_alone"] == pytest.approx(1.5)
    assert row["trainer_kept"] == pytest.approx(0.85, rel=1e-3)


def _start(result, exit_code=0, last_line="", began=0.0, ended=1.0):
    return {"index": 0, "began": began, "ended": ended, "exit": exit_code, "result": result, "last_line": last_line}


def test_caps_outcomes_and_summary():
    capped = _start({"over": False, "stage": "cuMemAlloc", "cuda_error": 2, "share_mib": 100, "asked_mib": 150})
    over = _start({"over": True, "stage": "cuMemAlloc", "cuda_error": 0, "share_mib": 100, "asked_mib": 150})
    # An MPS client is told the whole device's total: that alone says nothing, the refused allocation does.
    whole_total = _start(
        {"over": False, "stage": "cuMemAlloc", "cuda_error": 2, "share_mib": 100, "context_total_mib": 81000}
    )
    refused = _start(None, exit_code=13, last_line="gpupool: error: no MPS daemon answers", began=5, ended=7)
    init_failed = _start({"over": False, "stage": "cuCtxCreate_v2", "cuda_error": 999})
    assert outcome(capped)[0] == "capped"
    assert outcome(over)[0] == "over"
    assert outcome(whole_total) == ("capped", "the driver refused the allocation (CUresult 2)")
    assert outcome(refused) == ("stopped", "gpupool run exited 13: gpupool: error: no MPS daemon answers")
    assert outcome(init_failed)[0] == "stopped"
    over = dict(over, began=4.0, ended=4.5)
    summary = summarize([capped, over, whole_total, refused, init_failed], kills=[6.0])
    assert (summary["ran_over_cap"], summary["capped_by_the_driver"], summary["stopped_or_refused"]) == (1, 2, 2)
    assert summary["starts_during_a_daemon_kill"] == 1
    assert summary["over_cap_starts_s"] == [[4.0, 4.5]] and summary["daemon_kills_s"] == [6.0]
    assert sum(summary["reasons"].values()) == 5


def test_the_report_renders_every_part():
    split = figures.split(work([(0, 30, 10.0)]), work([(0, 30, 90.0)]), 0.1, 0.9)
    neighbour = figures.neighbour(
        [(t / 10, 0.004) for t in range(50)], work([(0, 5, 100.0)]),
        [(t / 10, 0.005) for t in range(50)], work([(0, 5, 90.0)]),
    )  # fmt: skip
    machine = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "torch": "2.11.0", "measured_at": "now"}
    caps = summarize([_start({"over": False, "stage": "cuMemAlloc", "cuda_error": 2})], kills=[])
    text = markdown(
        {
            "splits": dict(machine, splits=[dict(split, mode="mps")], alone=[{"mode": "mps", "of_whole_gpu": 0.26}]),
            "neighbour": dict(
                machine,
                inference_alone_whole_gpu=neighbour["inference_alone"],
                setups=[dict(neighbour, setup="mps thread %")],
            ),
            "caps": dict(machine, **caps, share=0.25, asked_times_share=1.5, concurrent=16),
        }
    )
    assert "NVIDIA H100 80GB HBM3, driver 580.159.04" in text
    assert "| mps | 0.1/0.9 | 1:9 | 1:9 | +0.0% | yes |" in text
    assert "| mps thread % | 4.0 → 5.0 | 4.0 → 5.0 | 1.25 | 90% |" in text
    assert "**0 ran over their cap**" in text
