"""`gpupool run`: claim, isolate, supervise the child, release (stdlib only).

Owns: the run session, the child's whole process tree (the guard: its parent and subreaper,
the lease's cgroup where writable; parent-death signal), the run's folder, signal forwarding, heartbeats, and the exit-code mapping (`child.exit_code`).
May import: core, pooling/ (floor 1) and workload/ (client), not the servers beside it; the
standard library only (workload side, shipped in gpupool-run.pyz).
"""

from .session import RunOptions, current_holder, progress, run

__all__ = ["RunOptions", "current_holder", "progress", "run"]
