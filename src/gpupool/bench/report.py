"""A benchmark's three outputs: report.json, report.md (a Markdown table) and report.png."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
REPORT_PNG = "report.png"


def write_all(report: Mapping[str, Any], out: Path) -> Dict[str, str]:
    """Write the three files into `out`; returns their paths by kind."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / REPORT_JSON, "markdown": out / REPORT_MD, "plot": out / REPORT_PNG}
    _atomic(paths["json"], json.dumps(report, indent=2) + "\n")
    _atomic(paths["markdown"], markdown(report))
    plot(report, paths["plot"])
    return {k: str(v) for k, v in paths.items()}


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _list(values: Optional[Sequence[Any]], digits: int = 1) -> str:
    return ", ".join(_num(v, digits) for v in values) if values else "–"


def headline(report: Mapping[str, Any]) -> str:
    """One line: what was trained, on what."""
    s, m = report["settings"], report["machine"]
    return (
        f"{s['model']}, {s['image_size']} px, batch {s['batch_size']} per worker, {s['data']} data, "
        f"{s['steps']} timed steps after {s['warmup']} warm-up; {m['accelerator']}, amp {m.get('amp') or 'off'}, "
        f"torch {m.get('torch') or '?'}, {m['cpus']} CPUs"
    )


def markdown(report: Mapping[str, Any]) -> str:
    """The report as a Markdown table, with a headline."""
    lines = [f"# gpupool bench {report['kind']}", "", headline(report), ""]
    if report["kind"] == "scaling":
        lines += [
            "| GPUs | share | images/s | images/s per GPU | speedup | efficiency | step p50 ms | step p95 ms | GPU memory MiB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in report["runs"]:
            if "error" in r:
                lines.append(f"| {r['gpus']} | {r['fraction']:g} | failed: {r['error']} |||||||")
                continue
            lines.append(
                f"| {r['gpus']} | {r['fraction']:g} | {_num(r['images_per_second'])} | "
                f"{_num(r['images_per_second_per_worker'])} | {_num(r['speedup'], 2)} | {_num(r['efficiency'], 2)} | "
                f"{_num(r['step_p50_ms'])} | {_num(r['step_p95_ms'])} | {_num(r['gpu_memory_mib'], 0)} |"
            )
    else:
        lines += [
            "| share | jobs | images/s, all jobs | vs one whole-GPU job | images/s per job | slowdown per job | fairness (min/max) | step p50 ms | GPU memory MiB per job |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in report["runs"]:
            if "error" in r:
                lines.append(f"| {r['fraction']:g} | {r['jobs']} | failed: {r['error']} |||||||")
                continue
            lines.append(
                f"| {r['fraction']:g} | {r['jobs']} | {_num(r['images_per_second'])} | "
                f"{_num(r['aggregate_vs_whole'], 2)} | {_list(r['per_job_images_per_second'])} | "
                f"{_list(r['slowdown'], 2)} | {_num(r['fairness'], 2)} | {_list(r['step_p50_ms'])} | "
                f"{_list(r['gpu_memory_mib'], 0)} |"
            )
    return "\n".join(lines) + "\n"


def plot(report: Mapping[str, Any], path: Path) -> None:
    """Throughput and efficiency against GPUs (scaling), or aggregate, per-job throughput
    and the ratio to a whole GPU against the share (share)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report["runs"] if "error" not in r]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    if report["kind"] == "scaling":
        gpus = [r["gpus"] for r in runs]
        ips = [r["images_per_second"] for r in runs]
        left.plot(gpus, ips, "o-", label="measured")
        if runs:
            per_gpu = runs[0]["images_per_second_per_worker"]
            left.plot(gpus, [per_gpu * g for g in gpus], "--", color="grey", label="linear")
        left.set_ylim(bottom=0)
        left.set_xlabel("GPUs")
        left.set_ylabel("images/s (all workers)")
        left.set_xticks(gpus)
        left.legend()
        effs = [r["efficiency"] for r in runs]
        right.plot(gpus, effs, "o-", color="tab:green")
        right.axhline(1.0, ls="--", color="grey")
        right.set_ylim(0, max([1.1] + [1.1 * e for e in effs if e is not None]))
        right.set_xlabel("GPUs")
        right.set_ylabel("scaling efficiency")
        right.set_xticks(gpus)
    else:
        labels = [f"{r['fraction']:g} x{r['jobs']}" for r in runs]
        xs = list(range(len(runs)))
        left.bar(xs, [r["images_per_second"] for r in runs], color="tab:blue", alpha=0.6, label="all jobs")
        for x, r in zip(xs, runs):
            per = r["per_job_images_per_second"]
            left.plot([x] * len(per), per, "o", color="tab:orange", label="each job" if x == 0 else None)
        left.set_xticks(xs)
        left.set_xticklabels(labels)
        left.set_xlabel("share of one GPU x jobs")
        left.set_ylabel("images/s")
        left.legend()
        right.plot(xs, [r["aggregate_vs_whole"] for r in runs], "o-", label="all jobs / one whole-GPU job")
        right.plot(xs, [r["fairness"] for r in runs], "s--", label="fairness (min/max)")
        right.axhline(1.0, ls=":", color="grey")
        right.set_xticks(xs)
        right.set_xticklabels(labels)
        ratios = [v for r in runs for v in (r["aggregate_vs_whole"], r["fairness"]) if v is not None]
        right.set_ylim(0, max([1.1] + [1.1 * v for v in ratios]))
        right.set_xlabel("share of one GPU x jobs")
        right.legend()
    fig.suptitle(_wrap(headline(report)), fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def _wrap(text: str, width: int = 130) -> str:
    words: List[str] = []
    line = ""
    for word in text.split():
        if len(line) + len(word) + 1 > width:
            words.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join(words + [line])
