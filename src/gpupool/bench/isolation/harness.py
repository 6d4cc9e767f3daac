"""Run the chosen parts of `gpupool bench isolation` and write OUT/<part>.json and OUT/report.md.

Each part's file carries the machine it ran on (GPU model, driver, torch), so a result copied into
benchmarks/results/ says where it came from. A part that fails is written with its error and the
others still run: a GPU lease is short, and half a report is better than none.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.isolation_mode import IsolationMode
from .caps import run_caps
from .figures import SPLIT_TOLERANCE
from .rounds import ProbeFailed, Settings, run_neighbour, run_splits, stop_mps

if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Sequence, Tuple

PARTS = ("splits", "neighbour", "caps")
# The bars, stated once: a neighbour's p99 at most this many times alone; the trainer keeps this much.
NEIGHBOUR_P99_BAR = 1.25
TRAINER_KEPT_BAR = 0.80
# The caps part's jobs ask for this many times their share.
CAPS_ASK_TIMES = 1.5


def machine(device: str) -> Dict[str, Any]:
    """The GPU model and driver (nvidia-smi), torch's version, and when."""
    info: Dict[str, Any] = {"measured_at": datetime.datetime.now().isoformat(timespec="seconds"), "device": device}
    try:
        info["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        info["torch"] = None
    smi = shutil.which("nvidia-smi")
    if device == "cuda" and smi:
        done = subprocess.run(
            [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        first = done.stdout.strip().splitlines()[:1]
        if first:
            name, _, driver = first[0].partition(",")
            info.update(gpu=name.strip(), driver=driver.strip())
    return info


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def run_parts(
    settings: Settings,
    parts: Sequence[str],
    *,
    modes: Sequence[IsolationMode],
    pairs: Sequence[Tuple[float, float]],
    split_s: float,
    alone_s: float,
    neighbour_s: float,
    inference_share: float,
    caps_share: float,
    starts: int,
    concurrent: int,
    kill_every_s: float,
    caps_limit_s: float,
) -> Dict[str, Dict[str, Any]]:
    """Each part in turn; OUT/<part>.json after each, OUT/report.md at the end."""
    settings.out.mkdir(parents=True, exist_ok=True)
    info = machine(settings.device)
    results: Dict[str, Dict[str, Any]] = {}
    for part in parts:
        body: Dict[str, Any]
        path = settings.out / f"{part}.json"

        def save(partial: Dict[str, Any], part: str = part, path: Path = path) -> None:
            # Rows so far: a run cut short (a GPU lease ending) still leaves them.
            write_json(path, dict(info, part=part, partial=True, **partial))

        try:
            if part == "splits":
                body = run_splits(settings, modes, pairs, split_s, alone_s, save)
            elif part == "neighbour":
                body = run_neighbour(settings, modes, inference_share, neighbour_s, alone_s, save)
            else:
                body = run_caps(settings, starts, concurrent, caps_share, CAPS_ASK_TIMES, kill_every_s, caps_limit_s)
        except ProbeFailed as err:
            body = {"error": str(err)}
            settings.progress(f"{part}: {err}")
        finally:
            stop_mps(settings)  # the next part (or the machine) starts without the rounds' MPS daemon
        results[part] = dict(info, part=part, **body)
        write_json(path, results[part])
    (settings.out / "report.md").write_text(markdown(results))
    return results


def _pct(x: Any) -> str:
    return "–" if x is None else f"{x:+.1%}"


def markdown(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The report as Markdown tables (the benchmarks page renders the same JSON)."""
    lines: List[str] = []
    any_part = next(iter(results.values()), {})
    lines.append(
        f"# gpupool bench isolation\n\n{any_part.get('gpu', any_part.get('device'))}, driver "
        f"{any_part.get('driver', '–')}, torch {any_part.get('torch', '–')}, {any_part.get('measured_at', '')}\n"
    )
    splits = results.get("splits", {})
    if splits.get("splits"):
        lines += [
            f"## Compute splits (two matmul leases; holds = within ±{SPLIT_TOLERANCE:.0%} of the asked ratio)\n",
            "| mode | shares | asked | delivered | error | holds | settled in s | window s |",
            "|---|---|---:|---:|---:|---|---:|---:|",
        ]
        for r in splits["splits"]:
            lines.append(
                f"| {r['mode']} | {r['asked'][0]:g}/{r['asked'][1]:g} | 1:{r['asked_ratio']:g} | "
                f"1:{r['delivered_ratio']:g} | {_pct(r['error'])} | {'yes' if r['holds'] else 'no'} | "
                f"{r['settle_s'] if r['settle_s'] is not None else 'never'} | {r['window_s']} |"
            )
        lines += ["", "| mode | one job alone at 0.25: share of the whole GPU's rate |", "|---|---:|"]
        lines += [f"| {r['mode']} | {r.get('of_whole_gpu')} |" for r in splits.get("alone", [])]
        lines.append("")
    neighbour = results.get("neighbour", {})
    if neighbour.get("setups"):
        whole = neighbour["inference_alone_whole_gpu"]
        lines += [
            f"## A latency-sensitive neighbour (bar: p99 ≤ {NEIGHBOUR_P99_BAR}× alone, trainer ≥ {TRAINER_KEPT_BAR:.0%})\n",
            f"Inference alone on the whole GPU: p50 {whole['p50_ms']} ms, p99 {whole['p99_ms']} ms.\n",
            "| setup | p50 ms alone → beside | p99 ms alone → beside | p99 × alone | trainer kept |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in neighbour["setups"]:
            a, b = r["inference_alone"], r["inference_beside"]
            lines.append(
                f"| {r['setup']} | {a['p50_ms']} → {b['p50_ms']} | {a['p99_ms']} → {b['p99_ms']} | "
                f"{r['p99_vs_alone']} | {r['trainer_kept']:.0%} |"
            )
        lines.append("")
    caps = results.get("caps", {})
    if "starts" in caps:
        lines += [
            "## Memory caps that fail closed\n",
            f"{caps['starts']} starts asking {caps['asked_times_share']}× a {caps['share']} share, "
            f"{caps['concurrent']} at a time, the MPS daemon killed {caps['daemon_kills']} times "
            f"({caps['starts_during_a_daemon_kill']} starts hit by a kill): **{caps['ran_over_cap']} ran over their cap**, "
            f"{caps['capped_by_the_driver']} capped by the driver, {caps['stopped_or_refused']} stopped or refused.\n",
            "| outcome | starts |",
            "|---|---:|",
        ]
        lines += [f"| {reason} | {n} |" for reason, n in caps["reasons"].items()]
        lines.append("")
    for part, body in results.items():
        if "error" in body:
            lines.append(f"**{part} failed:** {body['error']}\n")
    return "\n".join(lines)
