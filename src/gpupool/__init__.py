"""gpupool: pool GPUs and share them fractionally between training jobs."""

__version__ = "0.1.0"

# `typing.TYPE_CHECKING` without importing `typing`, which costs every `gpupool run` about 3 ms
# while the workload side needs it only for annotations (every module has `from __future__ import
# annotations`): `if TYPE_CHECKING:` blocks import typing's names for mypy, which, like other
# type checkers, reads any name TYPE_CHECKING as true.
TYPE_CHECKING = False
