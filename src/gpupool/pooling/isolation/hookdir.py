"""Materialise the post-import hook folder that goes first on the child's PYTHONPATH."""

from __future__ import annotations

import os
from pathlib import Path

HOOK_RESOURCE = "hook/sitecustomize.py"


def hook_source() -> bytes:
    """The hook's source; read through this module's loader (as pkgutil.get_data, without importing
    it) so it also works from inside the zipapp."""
    get_data = getattr(globals().get("__loader__"), "get_data", None)
    if get_data is None:  # pragma: no cover - only with an exotic loader
        raise FileNotFoundError(f"{__package__}/{HOOK_RESOURCE} cannot be read: its loader has no get_data")
    data: bytes = get_data(os.path.join(os.path.dirname(__file__), *HOOK_RESOURCE.split("/")))
    return data


def write_hook_dir(directory: Path) -> Path:
    """Write `sitecustomize.py` into `directory` (created) and return the folder.

    A real folder rather than a path into the package, because the child may
    run a different Python that cannot see gpupool (or read the zipapp).
    """
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    (target / "sitecustomize.py").write_bytes(hook_source())
    return target
