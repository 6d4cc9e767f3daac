"""What a replay prints: a few lines for a human, one JSON object for a machine, and a PNG curve."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Optional, Sequence

from .replay import Result


def text(result: Result) -> str:
    """The human summary of one replay."""
    first = (
        f"at {result.first_failure_arrival_percent:.1f} % arrival"
        if result.first_failure_arrival_percent is not None
        else "none"
    )
    level = (
        f"{result.arrive * 100:.0f} % arrival, seed {result.seed}"
        if result.mode == "arrival"
        else "timeline (unallocated at the peak of allocation)"
    )
    lines = [
        f"policy {result.policy}, {level}: {result.nodes} nodes, {result.gpus} GPUs, {result.tasks} tasks",
        f"  GPUs left unallocated: {result.unallocated_gpu_percent:.2f} %"
        f" ({result.gpus - result.allocated_milli / 1000:.1f} of {result.gpus})",
        f"  fragmentation (free GPU the typical task cannot use): {result.fragmentation_percent:.2f} % of the GPUs",
        f"  first failure: {first}",
        f"  tasks placed: {result.placed}, failed: {result.failed} ({result.failed_gpu_tasks} asking for GPUs)",
        f"  replay took {result.seconds:.1f} s",
    ]
    return "\n".join(lines)


def write_json(result: Result, out: IO[str]) -> None:
    json.dump(result.to_dict(), out)
    out.write("\n")


def plot(results: Sequence[Result], path: Path) -> Optional[str]:
    """Unallocated GPUs (%) against arrival (%) as a PNG; returns why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'gpupool[train]'): no PNG written"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max((a for r in results for a, _ in r.curve), default=100.0)
    ax.plot([0, 100, top], [100, 0, 0], color="grey", linestyle=":", label="every task placed")
    for r in results:
        xs = [a for a, _ in r.curve]
        ys = [100.0 - b for _, b in r.curve]
        ax.plot(xs, ys, label=f"{r.policy} ({r.unallocated_gpu_percent:.1f} % at the end)")
    ax.set_xlabel("GPUs asked for so far (% of the cluster's)")
    ax.set_ylabel("GPUs unallocated (% of the cluster's)")
    ax.set_title("Unallocated GPUs against arrival")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


class ProgressBar:
    """A one-line progress bar on a terminal (stderr); silent elsewhere."""

    def __init__(self, label: str, stream: Optional[IO[str]] = None) -> None:
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        width = 30
        filled = int(width * done / total)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()
