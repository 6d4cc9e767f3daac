"""The workload-side `gpupool` (run, status, list-gpus, release): standard library only.

The entry point of `gpupool-run.pyz` and of `python -m gpupool.cli.workload`;
it loads only the stdlib verb modules, so it works in any container with
Python >= 3.9 and nothing installed.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .main import WORKLOAD_MODULES
from .main import main as _main

if TYPE_CHECKING:
    from typing import List, Optional

MODULES = WORKLOAD_MODULES


def main(argv: Optional[List[str]] = None) -> int:
    """Run one workload-side command and return its exit code."""
    return _main(argv, modules=MODULES)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
