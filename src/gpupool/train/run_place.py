"""Where a run's files live: `--out` itself when it is a local folder, or, for a bucket URL,
a local working copy mirrored to it.

A bucket run keeps its checkpoints as a series, OUT/checkpoints/ckpt-<epochs>-<steps>.pt, each
put atomically (storage.put_file: a temporary name, then the store's rename), the newest
`keep` kept. Resume takes the newest one that loads, so a replica killed mid-write (which
leaves at most a .tmp- object) or a torn file never becomes the run's state. The small files
(split, metrics, config) follow each checkpoint; the report, plots and the exported model
follow at the end. The bucket is the truth: a job resumed on another node, or on this one,
starts from what the bucket holds.
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from gpupool.train import checkpoint, storage
from gpupool.train.bucket_data import cache_folder

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
_SERIES = re.compile(r"^ckpt-(\d{6})-(\d{9})\.pt$")
# Files that follow every checkpoint (the ones resume reads besides the checkpoint itself).
STATE_FILES = ("split.json", "metrics.jsonl", "config.json")


def series_name(epochs: int, steps: int) -> str:
    """The checkpoint's name after EPOCHS finished epochs and STEPS steps of the next one;
    names sort in training order."""
    return f"ckpt-{epochs:06d}-{steps:09d}.pt"


def newest_first(names: List[str]) -> List[str]:
    """The finished checkpoint names among NAMES, newest first (temporary objects left out)."""
    return sorted((n for n in names if _SERIES.match(n)), reverse=True)


@dataclass
class RunPlace:
    """The run's local folder (`local`) and, for a bucket run, the URL it mirrors (`url`)."""

    local: Path
    url: Optional[str] = None
    keep: int = 3

    @staticmethod
    def for_out(out: str, cache_dir: Path, rank: int, keep: int = 3) -> RunPlace:
        """A local `--out` (or file:// URL) as is; a bucket URL through CACHE/runs/... (one
        folder per rank, so co-located ranks never write each other's files)."""
        if not storage.is_remote(out):
            return RunPlace(storage.local_path(out), None, keep)
        return RunPlace(cache_folder(cache_dir, "runs", out) / f"rank-{rank}", out.rstrip("/"), keep)

    @property
    def remote(self) -> bool:
        return self.url is not None

    def shown(self) -> str:
        """The name people know the run by (a URL's password or signature as ***)."""
        return storage.redact(self.url) if self.url else str(self.local)

    def pull(self) -> None:
        """Make the local copy what the bucket holds (its state files; checkpoints come with
        load_checkpoint): a stale copy from an earlier run on this node must not win."""
        if self.url is None:
            return
        storage.require_bucket(self.url)
        if self.local.exists():
            shutil.rmtree(self.local)
        self.local.mkdir(parents=True)
        for name in STATE_FILES:
            remote = storage.join(self.url, name)
            if storage.exists(remote):
                storage.get_file(remote, self.local / name)

    def load_checkpoint(self) -> Optional[Dict[str, Any]]:
        """The newest checkpoint that loads, or None."""
        if self.url is None:
            return checkpoint.load(self.local)
        folder = storage.join(self.url, CHECKPOINTS)
        for name in newest_first(storage.listdir(folder)):
            try:
                storage.get_file(storage.join(folder, name), self.local / checkpoint.CHECKPOINT_FILE)
                ckpt = checkpoint.load(self.local)
            except Exception as err:  # a torn or foreign file: the one before it is the state
                log.warning("skipping checkpoint %s: %s", storage.redact(storage.join(folder, name)), err)
                continue
            if ckpt is not None:
                return ckpt
        return None

    def saved(self, epochs: int, steps: int) -> None:
        """After a checkpoint was written locally: put it in the series, drop the oldest beyond
        `keep`, then the state files."""
        if self.url is None:
            return
        folder = storage.join(self.url, CHECKPOINTS)
        storage.put_file(self.local / checkpoint.CHECKPOINT_FILE, storage.join(folder, series_name(epochs, steps)))
        self.push(*STATE_FILES)
        for old in newest_first(storage.listdir(folder))[self.keep :]:
            storage.remove(storage.join(folder, old))

    def push(self, *names: str) -> None:
        """Copy these local files to the bucket (each atomically); missing ones are skipped."""
        if self.url is None:
            return
        for name in names:
            path = self.local / name
            if path.is_file():
                storage.put_file(path, storage.join(self.url, name))

    def forget(self, name: str) -> None:
        """Delete a file the bucket holds from an earlier run (a stale report)."""
        if self.url is not None:
            storage.remove(storage.join(self.url, name))

    def forget_checkpoints(self) -> None:
        """Delete the bucket's checkpoint series (a run started over with --no-resume)."""
        if self.url is not None:
            folder = storage.join(self.url, CHECKPOINTS)
            for name in storage.listdir(folder):
                storage.remove(storage.join(folder, name))

    def push_results(self) -> None:
        """The report, plots and exported model: everything but the working checkpoint."""
        if self.url is None:
            return
        for path in sorted(self.local.rglob("*")):
            if path.is_file() and path.name != checkpoint.CHECKPOINT_FILE and not path.name.startswith("."):
                storage.put_file(path, storage.join(self.url, path.relative_to(self.local).as_posix()))
