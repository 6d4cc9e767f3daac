"""The env and hooks that hold a process to its share (stdlib only)."""

from .env import GpuShare, child_env, context_reserve_mib, isolation_env, shares
from .hookdir import write_hook_dir

__all__ = ["GpuShare", "child_env", "context_reserve_mib", "isolation_env", "shares", "write_hook_dir"]
