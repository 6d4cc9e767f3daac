"""`gpupool run`: claim, isolate, supervise the child, release (stdlib only)."""

from .session import RunOptions, current_holder, progress, run

__all__ = ["RunOptions", "current_holder", "progress", "run"]
