"""Running the `gpupool` command in a process of its own: one helper for every test.

`gpupool(*argv, env=...)` runs it to completion with its output captured;
`gpupool_cmd(*argv)` is its command line, for a test that starts it with Popen.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

# The module a test runs `gpupool` through: the full CLI; the workload side's own entry point
# (gpupool.cli.workload) is named where a test means that one.
GPUPOOL = [sys.executable, "-m", "gpupool"]


def gpupool_cmd(*argv: str, module: str = "gpupool") -> List[str]:
    """The command line of `gpupool ARGV`, through the interpreter running the tests."""
    return [sys.executable, "-m", module, *argv]


def gpupool(
    *argv: str,
    env: Optional[Dict[str, str]] = None,
    cwd: Optional[Path] = None,
    timeout: float = 120,
    module: str = "gpupool",
    check: bool = False,
) -> subprocess.CompletedProcess:
    """`gpupool ARGV` to completion in `env` (this process's environment if None), output captured
    as text; with `check`, its exit status must be 0 (the failure shows its output)."""
    done = subprocess.run(
        gpupool_cmd(*argv, module=module), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done
