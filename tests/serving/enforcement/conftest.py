"""Fixtures the watchdog's tests share."""

from __future__ import annotations

import subprocess
import sys
from typing import Iterable

import pytest


@pytest.fixture
def child() -> Iterable[subprocess.Popen]:
    """A live process to attribute and stop; killed after the test whatever it did."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()
