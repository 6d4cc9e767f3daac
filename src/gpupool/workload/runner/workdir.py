"""The run's private folder (the lease file and the hook): made at the claim, removed at release,
or by the guard when the runner was killed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Optional

# The folder's name: this prefix, the lease id (16 characters at most), a random suffix.
PREFIX = "gpupool-run-"


def make_workdir(lease_id: str) -> Path:
    """A private folder for the lease file and the hook (removed at release).

    As tempfile.mkdtemp (mode 0700, a random name, in $XDG_RUNTIME_DIR when writable, else
    $TMPDIR, $TEMP, $TMP, /tmp ...), without importing tempfile, random and shutil at every `gpupool run`.
    """
    safe = "".join(ch for ch in lease_id if ch.isalnum() or ch in "-_")[:16]
    env = [os.environ.get(k, "") for k in ("XDG_RUNTIME_DIR", "TMPDIR", "TEMP", "TMP")]
    error: Optional[OSError] = None
    for parent in [p for p in env if p] + ["/tmp", "/var/tmp", "/usr/tmp"]:
        for _ in range(10):
            path = os.path.join(parent, f"{PREFIX}{safe}-{os.urandom(4).hex()}")
            try:
                os.mkdir(path, 0o700)
                return Path(path)
            except FileExistsError:
                continue
            except OSError as err:  # not there, or not writable: the next candidate
                error = err
                break
    raise error or FileExistsError(f"no free name for the run's folder ({safe})")


def remove_tree(top: Path) -> None:
    """shutil.rmtree(top, ignore_errors=True) without importing shutil: links are removed, not followed."""
    for folder, dirs, files in os.walk(top, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass
        for name in dirs:
            try:
                os.rmdir(os.path.join(folder, name))
            except OSError:
                pass
    try:
        os.rmdir(top)
    except OSError:
        pass
