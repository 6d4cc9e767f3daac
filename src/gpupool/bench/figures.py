"""The figures of a benchmark, from the workers' result files: pure functions, no I/O.

A data-parallel job's ranks step together, so its throughput is all its images over the
slowest rank's timed span, and its step time is the slowest rank's at each step. Concurrent
jobs on one GPU are separate jobs: each has its own throughput, and the aggregate is their sum.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..core.percentile import percentile as percentile  # the project's one definition
from .plan import Run

Result = Mapping[str, Any]  # one worker's result-TAG-rRANK.json


def job_figures(ranks: Sequence[Result]) -> Dict[str, Any]:
    """Throughput, step times and peak memory of one job from all its ranks' results."""
    if not ranks:
        raise ValueError("a job without results")
    seconds = max(float(r["seconds"]) for r in ranks)
    images = sum(int(r["images"]) for r in ranks)
    steps = min(len(r["step_seconds"]) for r in ranks)
    slowest = [max(float(r["step_seconds"][i]) for r in ranks) for i in range(steps)]
    ips = images / seconds if seconds > 0 else 0.0
    return {
        "workers": len(ranks),
        "images": images,
        "seconds": round(seconds, 4),
        "images_per_second": round(ips, 2),
        "images_per_second_per_worker": round(ips / len(ranks), 2),
        "step_p50_ms": round(percentile(slowest, 50) * 1000, 3),
        "step_p95_ms": round(percentile(slowest, 95) * 1000, 3),
        "gpu_memory_mib": _peak(ranks, "gpu_used_mib") or _peak(ranks, "gpu_reserved_mib"),
        "gpu_reserved_mib": _peak(ranks, "gpu_reserved_mib"),
        "max_rss_mib": _peak(ranks, "max_rss_mib"),
        "devices": sorted({str(r.get("visible_devices", "")) for r in ranks}),
    }


def _peak(ranks: Sequence[Result], key: str) -> Optional[float]:
    values = [r.get("memory", {}).get(key) for r in ranks]
    present = [float(v) for v in values if v is not None]
    return max(present) if present else None


def scaling_row(run: Run, job: Dict[str, Any], base: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """One row of the scaling table; efficiency is per-worker throughput against the
    smallest GPU count's (1 when the list starts at 1, as it should)."""
    row = {"gpus": run.workers, "fraction": run.fraction, **job}
    if base is not None and base["images_per_second_per_worker"] > 0:
        row["speedup"] = round(job["images_per_second"] / base["images_per_second"], 3)
        row["efficiency"] = round(job["images_per_second_per_worker"] / base["images_per_second_per_worker"], 3)
    else:
        row["speedup"] = row["efficiency"] = None
    return row


def share_row(run: Run, jobs: List[Dict[str, Any]], whole: Optional[float]) -> Dict[str, Any]:
    """One row of the share table: aggregate against one whole-GPU job (`whole` images/s),
    each job's slowdown (whole / its own throughput) and fairness (min/max throughput)."""
    per_job = [j["images_per_second"] for j in jobs]
    aggregate = sum(per_job)
    row: Dict[str, Any] = {
        "fraction": run.fraction,
        "jobs": len(jobs),
        "images_per_second": round(aggregate, 2),
        "per_job_images_per_second": per_job,
        "aggregate_vs_whole": round(aggregate / whole, 3) if whole else None,
        "slowdown": [round(whole / x, 3) if x > 0 else None for x in per_job] if whole else None,
        "fairness": round(min(per_job) / max(per_job), 3) if per_job and max(per_job) > 0 else None,
        "step_p50_ms": [j["step_p50_ms"] for j in jobs],
        "step_p95_ms": [j["step_p95_ms"] for j in jobs],
        "gpu_memory_mib": [j["gpu_memory_mib"] for j in jobs],
        "max_rss_mib": [j["max_rss_mib"] for j in jobs],
        "devices": sorted({d for j in jobs for d in j["devices"]}),
    }
    return row
