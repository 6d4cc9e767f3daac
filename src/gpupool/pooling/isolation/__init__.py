"""The env and hooks that hold a process to its share, and the process tree (stdlib only).

Owns: the runner env contract (`env`: every variable name, defined once), the post-import
hook (`hook/`, `hookdir`), MPS daemon supervision (`mps`), /proc process trees
(`proctree`, with the one `alive(pid)`), and a lease's cgroup v2 (`cgroup`).
May import: core (floor 1: its own floor and core); the standard library only.
"""

from .env import GpuShare, child_env, context_reserve_mib, isolation_env, shares
from .hookdir import write_hook_dir

__all__ = ["GpuShare", "child_env", "context_reserve_mib", "isolation_env", "shares", "write_hook_dir"]
