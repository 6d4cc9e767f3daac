"""What the training and data benchmarks do with their figures (imported beside each script)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional


def load_average() -> Optional[float]:
    """The machine's 1-minute load average, to read the figures by (None where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def write_and_show(figures: Mapping[str, Any], out: Path) -> None:
    """`figures` as indented JSON into `out` (its folder made), and the same on stdout."""
    text = json.dumps(figures, indent=2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(text)
