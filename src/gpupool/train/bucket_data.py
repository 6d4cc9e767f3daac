"""Class-folder data sets in a bucket (`--data s3://bucket/digits`), read through a bounded
local cache.

The bucket is listed once per job (the split is made from that listing and saved with the run,
so a resumed job lists nothing); each image is fetched on its first read into
CACHE/<relative path> and read from local disk after that, so a cached epoch runs at the speed
of local files. The cache is kept under its size by evicting the least recently read files;
each loader process checks the total after every tenth of the size it has added, so the cache
may exceed its size by that much per process between checks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Dict, List, Tuple

from gpupool.train import storage

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 20 << 30
CACHE_ENV = "GPUPOOL_CACHE_DIR"


def default_cache_dir() -> Path:
    """$GPUPOOL_CACHE_DIR, else $XDG_CACHE_HOME/gpupool, else ~/.cache/gpupool."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpupool"


def cache_folder(cache_dir: Path, kind: str, url: str) -> Path:
    """CACHE/KIND/<name>-<hash of the URL>: one folder per data set or run, readable by people."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return cache_dir / kind / f"{storage.name(url) or 'root'}-{digest}"


class BucketFiles:
    """The files of a class-folder data set at URL, as local paths through a bounded cache."""

    def __init__(self, url: str, cache_dir: Path, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.url = url.rstrip("/")
        self.cache = cache_folder(cache_dir, "data", self.url)
        self.max_bytes = max_bytes
        self._added = 0

    def scan(self) -> Tuple[List[str], List[Tuple[str, int]]]:
        """Classes (sorted top-level folder names) and (relative path, class index) samples,
        from one listing of the bucket.

        Raises:
            StorageError: the URL, its bucket or the credentials are wrong.
            InvalidInput: fewer than two class folders with images.
        """
        from gpupool.core.errors import InvalidInput
        from gpupool.train.data import IMAGE_EXTENSIONS

        by_class: Dict[str, List[str]] = {}
        for rel in storage.find(self.url):
            parts = rel.split("/")
            if len(parts) < 2 or any(p.startswith(".") for p in parts):
                continue
            if os.path.splitext(rel)[1].lower() in IMAGE_EXTENSIONS:
                by_class.setdefault(parts[0], []).append(rel)
        classes = sorted(by_class)
        if len(classes) < 2:
            raise InvalidInput(
                f"data at {self.url} holds {len(classes)} class folder(s) with images; expected "
                f"{self.url}/<class>/*.{{jpg,jpeg,png}} with at least two classes"
            )
        samples = [(rel, i) for i, c in enumerate(classes) for rel in sorted(by_class[c])]
        return classes, samples

    def exists(self, rel: str) -> bool:
        """Whether the data set still holds REL (cached counts)."""
        return (self.cache / rel).is_file() or storage.exists(storage.join(self.url, rel))

    def class_names(self) -> Dict[str, str]:
        """URL/synsets.json as {folder: name}, {} when there is none."""
        try:
            names = json.loads(storage.read_bytes(storage.join(self.url, "synsets.json")))
        except (storage.StorageError, ValueError):
            return {}
        return {str(k): str(v) for k, v in names.items()} if isinstance(names, dict) else {}

    def local(self, rel: str) -> str:
        """REL as a local file, fetched into the cache on its first read."""
        path = self.cache / rel
        try:
            os.utime(path)  # the eviction order: least recently read first
            return str(path)
        except FileNotFoundError:
            pass
        storage.get_file(storage.join(self.url, rel), path)
        self._added += path.stat().st_size
        if self._added >= self.max_bytes // 10:
            self._added = 0
            self.evict()
        return str(path)

    def evict(self) -> int:
        """Delete the least recently read files until the cache is under its size; bytes freed."""
        files: List[Tuple[float, int, str]] = []
        total = 0
        for root, _, names in os.walk(self.cache):
            for n in names:
                p = os.path.join(root, n)
                try:
                    st = os.stat(p)
                except FileNotFoundError:  # another loader process evicted it
                    continue
                files.append((st.st_mtime, st.st_size, p))
                total += st.st_size
        freed = 0
        if total <= self.max_bytes:
            return 0
        for _, size, p in sorted(files):
            if total - freed <= self.max_bytes * 9 // 10:
                break
            try:
                os.unlink(p)
                freed += size
            except FileNotFoundError:
                pass
        log.debug("evicted %d bytes from %s", freed, self.cache)
        return freed
